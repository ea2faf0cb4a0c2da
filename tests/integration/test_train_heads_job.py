"""The TokenSwift head-training stage for real: a private Ray head, `ray job submit`, Ray Train with 2
CPU workers, the toy teacher frozen. The exported heads are loaded into the faithful long-generation
engine (greedy output identical to plain greedy decoding, more than one token per target forward), a
rerun of the finished run does no work, and raising `steps` resumes from the last checkpoint.

Traces come from the toy's Python generator (the texts the teacher was trained to write), not the vLLM
traces stage, so the module needs no vLLM and stays short.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest

from pipelines.common.parts import write_part
from pipelines.common.schemas import TRACES, to_table
from pipelines.common.train_run import EVENTS, read_events
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems
from specexit_core.toy.traces import make_trace
from support.cli import output_json, run_json
from support.ray_head import LocalHead, retry_no_agent

pytestmark = [pytest.mark.slow(minutes=2.5)]

N_TRACES = 16
STEPS = 30


def _trace_rows(tok) -> list[dict]:
    """Rows of the traces stage's schema: the teacher's chat prompt and a trace it was trained on."""
    from specexit_core.toy.teacher_eval import prompt_ids

    rng = random.Random(0)
    rows = []
    for i, p in enumerate(problems("train", N_TRACES, seed=3)):
        tr = make_trace(p, rng)
        pids = prompt_ids(tok, p)
        comp = tok(tr.completion, add_special_tokens=False)["input_ids"]
        rows.append(
            {
                "id": f"t{i}",
                "status": "ok",
                "prompt": p.prompt,
                "gold": str(p.answer),
                "prompt_token_ids": pids,
                "completion_token_ids": comp,
                "completion_text": tr.completion,
                "finish_reason": "stop",
                "num_prompt_tokens": len(pids),
                "num_completion_tokens": len(comp),
            }
        )
    rows.append({"id": "bad", "status": "error", "error": "engine died"})  # error rows are skipped
    return rows


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("heads")
    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    rows = _trace_rows(tok)
    write_part(d / "traces", to_table(rows[:8], TRACES))
    write_part(d / "traces", to_table(rows[8:], TRACES))
    cfg = {
        "input": str(d / "traces"),
        "output": str(d / "heads"),
        "target": str(TEACHER_DIR),
        "run_name": "h",
        "storage_path": str(d / "ray_train"),
        "num_workers": 2,
        "use_gpu": False,
        "num_heads": 3,
        "steps": STEPS,
        "lr": 0.005,
        "batch_size": 4,
        "batch_positions": 512,
        "log_every": 10,
        "checkpoint_every": 10,
    }
    (d / "train_heads.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    return d


@pytest.fixture(scope="module")
def cluster():
    c = LocalHead(prefix="rayh")
    c.start()
    yield c
    c.stop()


def _submit(cluster: LocalHead, config: Path) -> tuple[str, dict]:
    args = ["job", "submit", "--address", cluster.address, "--working-dir", ".", "--"]
    args += ["python", "-m", "pipelines.train_heads", "--config", str(config)]
    r = retry_no_agent(lambda: cluster.ray(*args))
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    return r.stdout, output_json(r.stdout)


def _starts(work: Path) -> list[dict]:
    return [e for e in read_events(work / "ray_train" / "h" / EVENTS) if e["event"] == "start"]


def test_job_trains_heads_the_engine_uses_losslessly(cluster, work):
    import torch

    from specexit_core.longgen.engine import LongGenConfig, LongGenEngine
    from specexit_core.longgen.heads import load_heads
    from specexit_core.longgen.plain import plain_decode
    from specexit_core.longgen.tree import TreeConfig
    from specexit_core.toy.hf_generate import load_teacher
    from specexit_core.toy.teacher_eval import prompt_ids

    logs, s = _submit(cluster, work / "train_heads.yaml")
    assert s["complete"] and not s["skipped"] and s["step"] == STEPS, s
    assert s["trained_rows"] == N_TRACES and s["skipped_rows"] == 1 and s["resumed_from_steps"] == []
    for step in (1, 10, 20, 30):  # per-step progress in the job log
        assert f"[heads] step {step}/{STEPS} loss=" in logs
    cfg = json.loads((work / "heads" / "config.json").read_text())
    assert cfg["num_heads"] == 3 and cfg["training"]["target"] == str(TEACHER_DIR)
    assert cfg["training"]["steps"] == STEPS and cfg["training"]["loss"] == s["loss"] < 12  # untrained: ~12

    torch.set_num_threads(1)
    model, tok = load_teacher(TEACHER_DIR)
    eng = LongGenEngine(model, None, LongGenConfig(tree=TreeConfig(ngram_top_k=0)))  # the heads alone draft
    eng.heads = load_heads(work / "heads", dtype=eng.target.dtype)
    for p in problems("test", 2):
        ids = prompt_ids(tok, p)
        res = eng.generate(ids, 96)
        assert res.token_ids == plain_decode(eng.target, ids, 96).token_ids  # lossless
        assert res.stats.tokens_per_forward > 1.3, res.stats.to_json()


def test_finished_rerun_is_a_noop_and_more_steps_resume(cluster, work):
    before = json.loads((work / "heads" / "specexit_train.json").read_text())["summary"]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)  # the same command run locally: it must not even start Ray
    _, s = run_json(
        [sys.executable, "-m", "pipelines.train_heads", "--config", work / "train_heads.yaml"], env=env, timeout=120
    )
    assert s["skipped"] and s["step"] == STEPS and s["loss"] == before["loss"], s
    assert len(_starts(work)) == 1  # no worker group started: nothing retrained

    cfg = json.loads((work / "train_heads.yaml").read_text())
    cfg.update(steps=STEPS + 4, log_every=2)  # steps may change on a resume (run-only key)
    (work / "train_more.yaml").write_text(json.dumps(cfg))
    logs, s = _submit(cluster, work / "train_more.yaml")
    assert s["complete"] and not s["skipped"] and s["step"] == STEPS + 4, s
    assert s["resumed_from_steps"] == [STEPS] and f"resuming from step {STEPS}" in logs
    assert json.loads((work / "heads" / "config.json").read_text())["training"]["steps"] == STEPS + 4
