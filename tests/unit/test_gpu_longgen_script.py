"""scripts/gpu_longgen.py (issue 14's GPU script; ran on an H200) works end to end at its CPU smoke size: heads
trained in-process, the torch rows of `specexit bench longgen` per length, a length over the time budget skipped
with the reason, greedy rows identical to plain."""

import importlib.util
import json
from pathlib import Path


def load_script():
    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_longgen.py"
    spec = importlib.util.spec_from_file_location("gpu_longgen", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_longgen_smoke_trains_heads_measures_a_length_and_skips_one_over_budget(tmp_path):
    out = tmp_path / "gpu_longgen.json"
    argv = [
        "--smoke",
        "--lengths",
        "8,64",
        "--budget-s",
        "0.001",
        "--out",
        str(out),
        "--heads-dir",
        str(tmp_path / "h"),
    ]
    assert load_script().main(argv) == 0
    res = json.loads(out.read_text())
    assert res["heads"]["steps"] == 10 and len(res["heads"]["head_top1"]) == 3
    assert set(res["lengths"]) == {"8"} and "budget" in res["skipped_lengths"]["64"]
    rows = res["rows"]
    assert {(r["method"], r["backend"]) for r in rows} == {("plain", "torch"), ("tokenswift", "torch")}
    assert len(rows) == 2 * 2 * 2  # 2 methods x T {0, 0.6} x penalty {off, on}
    assert all(r["identical_to_plain"] for r in rows if r["temperature"] == 0.0)
    assert res["lengths"]["8"]["skipped"]["eagle3"].startswith("backend vllm not asked for")
