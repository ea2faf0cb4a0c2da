"""README's main command runs (small n): teacher eval + vLLM with the SpecExit draft, off vs on."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm


def test_toy_demo_json():
    out = subprocess.run([sys.executable, "-m", "specexit_core.cli", "toy", "demo", "--n", "12", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert res["teacher"]["n"] == 12
    assert set(res["vllm"]) == {"eagle3", "specexit"}
    assert res["vllm"]["specexit"]["think_tokens"] < res["vllm"]["eagle3"]["think_tokens"]
    assert res["think_token_reduction"] > 0.1
