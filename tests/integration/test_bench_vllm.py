"""`specexit bench vllm --json` runs and reports every method side by side (a smoke run, n=4)."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm


def test_bench_vllm_json():
    out = subprocess.run([sys.executable, "-m", "specexit_app.cli", "bench", "vllm", "--n", "4", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert set(res["methods"]) == {"eagle3", "specexit", "specexit_never_fires"}
    for m in res["methods"].values():
        for key in ("accuracy", "think_tokens", "latency_s", "acceptance_length"):
            assert key in m
        assert 1.0 < m["acceptance_length"] <= 4.0  # k=3: at most 3 drafts + 1 bonus per step
    # the never-firing thresholds must not change the text; the default exit shortens thinking
    assert res["methods"]["specexit_never_fires"]["think_tokens"] == res["methods"]["eagle3"]["think_tokens"]
    assert res["methods"]["specexit"]["think_tokens"] <= res["methods"]["eagle3"]["think_tokens"]
    # same text, same drafts: per-method counters give the same acceptance for never-fires and eagle3
    assert res["methods"]["specexit_never_fires"]["acceptance_length"] == pytest.approx(
        res["methods"]["eagle3"]["acceptance_length"], abs=1e-9)
