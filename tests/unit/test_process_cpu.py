"""tests/support/process_cpu.py: the suite's CPU by kind of process (docs/testing.md § Where the time goes)."""

import json
import sys

from support.process_cpu import OTHER, kind, record, summarise


def test_processes_are_named_by_their_latest_role():
    assert kind(["python default_worker.py --raylet-name=x", "ray::IDLE"]) == "Ray workers that never ran anything"
    assert kind(["ray::IDLE", "ray::FooterReader.__init__", "ray::FooterReader"]) == "Ray Data footer readers"
    worker = ["python default_worker.py --raylet-name=x", "ray::IDLE", "ray::MapWorker(MapBatches(EvalWorker))"]
    assert kind(worker) == "Ray Data engine actors (traces, labels, evaluation)"
    assert kind(["VLLM::EngineCore"]) == "vLLM engine-core process"
    assert kind(["VLLM::Worker_TP1"]) == "vLLM worker processes, tensor parallel"
    assert kind([".venv/bin/python3 .venv/bin/ray job status --address http://x j"]) == "`ray job status` CLI"
    assert kind(["kworker/0:1"]) == OTHER


def test_record_counts_a_childs_cpu_and_summarise_groups_it(tmp_path):
    out = tmp_path / "cpu.json"
    assert record(out, [sys.executable, "-c", "import time; t = time.time()\nwhile time.time() - t < 0.8: pass"]) == 0
    doc = json.loads(out.read_text())
    busy = [p for p in doc["processes"] if any("while time.time()" in c for c in p["cmds"])]
    assert len(busy) == 1 and 0.3 < busy[0]["cpu_s"] < 2.0, busy
    s = summarise(doc)
    assert (
        s["processes"] == len(doc["processes"])
        and abs(s["total_cpu_s"] - sum(p["cpu_s"] for p in doc["processes"])) < 0.5
    )
