"""scripts/gpu_check.py, the GPU acceptance script, runs on the CPU build (`--smoke`): its real-shape
stage builds a random Qwen3-architecture target with the shipped Qwen3 tokenizer (151,936-token
vocabulary) and a random SpecExit draft for it, and vLLM runs it with the exit firing and the hook
neither failing nor falling back."""

import json
import sys

import pytest

from support.cli import run
from support.paths import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=1)]


def test_gpu_check_smoke_real_shape(tmp_path):
    out = tmp_path / "gpu_check.json"
    r = run(
        [sys.executable, REPO_ROOT / "scripts" / "gpu_check.py", "--smoke", "--stages", "real_shape", "--out", out],
        timeout=600,
    )
    res = json.loads(out.read_text())
    st = res["real_shape"]
    assert r.returncode == 0 and res["ok"], json.dumps(st, indent=1)[-4000:]
    assert st["hook"]["exits"] > 0 and not st["hook"].get("fallbacks") and not st["hook"].get("hook_errors")
    runs = st["runs"]
    assert runs["specexit"]["tokens"] == runs["eagle3"]["tokens"] > 0  # ignore_eos: same work on both sides
    assert st["engine"]["tensor_parallel_size"] == 1 and st["engine"]["dtype"] == "torch.float32"
