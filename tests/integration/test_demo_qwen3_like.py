"""`specexit demo --teacher qwen3-like --quick --json`: the whole loop on the built-in qwen3-like teacher
(Qwen3's real 151,936-id vocabulary and chat template). Mechanics, not accuracy: traces in Qwen3's
template that close `</think>`, labels at BPE paragraph breaks, a small top-N draft vocab over the big
target trained by Ray Train and loaded by vLLM, calibration, the Serve endpoint splitting the reasoning
with the `qwen3` parser and reporting usage telemetry, evaluation and report; the same JSON as the toy's."""

import glob
import json
import os
from pathlib import Path

import pytest

from support.cli import run_json, specexit
from support.ports import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=10)]


def test_qwen3_like_demo_quick(tmp_path):
    import pyarrow.parquet as pq

    from specexit_core.teachers import qwen3_like as q3

    wd = tmp_path / "demo"
    teachers = tmp_path / "teachers"  # materialised on first use by the run itself (driver and Ray workers)
    env = {**os.environ, "SPECEXIT_TEACHERS_DIR": str(teachers), "HF_HUB_OFFLINE": "1"}
    out, res = run_json(
        specexit(
            "demo", "--teacher", "qwen3-like", "--quick", "--json", "--workdir", str(wd), "--port", str(free_port())
        ),
        timeout=1500,
        env=env,
    )
    # the toy demo's JSON, plus the teacher's name
    assert res["teacher"] == "qwen3-like"
    names = {"plain", "eagle3", "specexit", "specexit_paper", "budget", "deer", "dynasor", "nothink", "oracle"}
    assert set(res["methods"]) == names
    fields = {"accuracy", "accuracy_ci95", "accuracy_vs_eagle3", "think_tokens", "latency_s", "probe_requests"}
    for name, m in res["methods"].items():
        assert set(m) == fields and 0 <= m["accuracy"] <= 1 and m["latency_s"] > 0
        assert (m["accuracy_vs_eagle3"] is None) == (name == "eagle3")
    assert res["methods"]["nothink"]["think_tokens"] == 0
    st = res["stages"]
    assert list(st) == ["traces", "labels", "train_draft", "calibrate", "serve", "evaluate"]
    assert st["traces"]["ok"] + st["traces"]["errors"] == st["traces"]["input_rows"] == 24
    assert st["train_draft"]["step"] == 6 and st["evaluate"]["complete"] and st["evaluate"]["n"] == 6
    assert (teachers / "qwen3-like" / "config.json").exists()

    # traces: Qwen3's chat template (thinking on), closed by </think>
    tok = q3.load_tokenizer()
    traces = pq.read_table(glob.glob(str(wd / "traces" / "part-*.parquet"))).to_pylist()
    ok = [r for r in traces if r["status"] == "ok"]
    assert ok and tok.decode(ok[0]["prompt_token_ids"]).endswith("<|im_end|>\n<|im_start|>assistant\n")
    closed = [r for r in ok if r["finished_think"]]
    assert closed and all(q3.THINK_END_ID in r["completion_token_ids"] for r in closed)
    # labels: probed at Qwen3's single-token paragraph breaks (".\n\n", not a bare "\n\n" after a period)
    labels = [r for r in pq.read_table(glob.glob(str(wd / "labels" / "part-*.parquet"))).to_pylist() if r["boundaries"]]
    breaks = {tok.decode([r["completion_token_ids"][b]]) for r in labels for b in r["boundaries"]}
    assert breaks and all(b.endswith("\n\n") for b in breaks) and ".\n\n" in breaks
    # the draft: a small top-N vocab over the 151,936-id target, with </think> in it
    draft = json.loads((wd / "draft" / "config.json").read_text())
    assert draft["vocab_size"] == q3.FULL_VOCAB_SIZE and draft["draft_vocab_size"] == 192
    assert draft["specexit"]["exit_defaults"] == st["calibrate"]["exit"]  # calibrated, then served and evaluated
    # the endpoint: the qwen3 parser returns the thinking as reasoning, usage carries SpecExit's telemetry
    serve = json.loads((wd / "serve.json").read_text())
    assert serve["requests"] == 4 and serve["reasoning_separated"] and st["serve"]["reasoning_separated"]
    for r in serve["rows"]:  # (a thinking that never closes comes back all reasoning, answer None)
        assert r["reasoning"] and "</think>" not in (r["answer"] or "") and "<think>" not in r["reasoning"]
        assert r["usage_specexit"]["enabled"] == r["specexit"] and r["usage_specexit"]["think_tokens"] > 0
    assert any(r["answer"] for r in serve["rows"])  # at least one closed thinking, split by the parser
    report = Path(res["report"])
    assert report.exists() and "| specexit |" in report.read_text()
    assert "Ray stopped" in out.stderr.strip().splitlines()[-1]
