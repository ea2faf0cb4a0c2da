"""The three pipeline jobs for real: a Ray head on loopback, `ray job submit`, the vLLM CPU engine,
the toy teacher. Outputs are read back and checked (schemas, label ranges, coverage), jobs are
killed midway and resubmitted, the driver is rerun, and the exported
draft is loaded by vLLM for EAGLE-3 speculative decoding.

The tests share one cluster and run in file order (each stage reads the previous one's output).
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.common.parts import read_all
from pipelines.common.schemas import LABELS, TRACES
from pipelines.common.writer import DIE_AFTER_COMMIT_ENV, DIED_MARKER
from pipelines.labels.labeler import KILL_ENGINE_ENV, KILLED_MARKER
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems
from support.cli import output_json, run_json
from support.cli import run as run_cmd
from support.ray_head import LocalHead, retry_no_agent
from support.ray_train import LOG_TERMS
from support.runbook import job_commands, stage_of

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=11)]

N_GOOD = 12  # + 5 bad rows: 5 parts of 4 rows, enough for a kill after the first and two retried writers
STEPS = 10  # draft training steps (checkpoints every 5; the rerun below resumes from the last): 50 s, 54 s at 20
TEACHER = os.environ.get("SPECEXIT_TEST_TEACHER", str(TEACHER_DIR))


class Cluster(LocalHead):
    """A private Ray head (tests/support/ray_head.py: its job API too) plus the `ray job submit` calls these tests make."""

    def submit(
        self,
        stage: str,
        config: Path,
        *extra: str,
        env_vars: dict | None = None,
        wait: bool = True,
        job_id: str | None = None,
    ):
        args = [
            "job",
            "submit",
            "--address",
            self.address,
            "--working-dir",
            ".",
            "--runtime-env-json",
            json.dumps({"env_vars": env_vars or {}}),
        ]
        if job_id:
            args += ["--submission-id", job_id]
        if not wait:
            args.append("--no-wait")
        args += ["--", "python", "-m", f"pipelines.{stage}", "--config", str(config), *extra]
        return retry_no_agent(lambda: self.ray(*args))


@pytest.fixture(scope="module")
def cluster():
    if not (Path(TEACHER) / "config.json").exists():
        pytest.skip(f"no toy teacher at {TEACHER} (run `specexit toy build`)")
    c = Cluster()
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Input prompts (toy problems + every kind of bad row) and chained configs."""
    d = tmp_path_factory.mktemp("pipes")
    rows = [
        {"id": f"p{i}", "prompt": p.prompt, "gold": str(p.answer)}
        for i, p in enumerate(problems("train", N_GOOD, seed=7))
    ]
    bad = [
        {"id": "empty", "prompt": "   ", "gold": "1"},
        {"id": "number", "prompt": 123, "gold": "1"},
        {"id": "long", "prompt": " ".join(["7"] * 600), "gold": "1"},
        {"id": "noprompt", "question": "x"},
        {"id": "p3", "prompt": "Compute from left to right : 1 + 2", "gold": "3"},
    ]  # duplicate id
    lines = [json.dumps(r) for r in rows[:10]] + [json.dumps(r) for r in bad] + [json.dumps(r) for r in rows[10:]]
    (d / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    eng = {"model": TEACHER, "dtype": "float32", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 64}
    cfgs = {
        "traces": {
            "input": {"kind": "jsonl", "path": str(d / "prompts.jsonl"), "gold_column": "gold"},
            "output": str(d / "traces"),
            "chunk_rows": 4,
            "engine": {**eng, "batch_size": 4},
            "sampling": {"temperature": 0.6, "max_tokens": 400, "seed": 0},
        },
        "labels": {
            "input": str(d / "traces"),
            "output": str(d / "labels"),
            "chunk_rows": 4,
            "grader": "toy",
            "probe_max_tokens": 6,
            # two probes per break, sampled (the demos and the node-loss drills probe greedily, once)
            "probe_sampling": {"samples": 2, "temperature": 0.6},
            # the kill test SIGKILLs the engine core's processes: they must be processes of their own
            "engine": {**eng, "batch_size": 4, "max_num_seqs": 128, "engine_core": "process"},
        },
        "train_draft": {
            "input": str(d / "labels"),
            "output": str(d / "draft"),
            "target": TEACHER,
            "run_name": "t",
            "storage_path": str(d / "ray_train"),
            "num_workers": 2,
            "use_gpu": False,
            "aux_layer_ids": [1, 2, 3],
            "draft_vocab_size": 160,
            "steps": STEPS,
            "batch_size": 4,
            "warmup_steps": 5,
            "log_every": 5,
            "checkpoint_every": 5,
            "max_failures": 2,
        },
    }
    for k, v in cfgs.items():
        (d / f"{k}.yaml").write_text(json.dumps(v))  # JSON is YAML
    return d


def _ids(folder: Path) -> collections.Counter:
    return collections.Counter(read_all(folder, ["id"]).column("id").to_pylist())


def _expected_ids() -> set[str]:
    return {f"p{i}" for i in range(N_GOOD)} | {"empty", "number", "long", "noprompt", "p3#dup1"}


def test_traces_job_killed_midway_then_resubmitted(cluster, work):
    out = work / "traces"
    r = cluster.submit("traces", work / "traces.yaml", env_vars={"SPECEXIT_TEST_KILL_AFTER_PARTS": "1"})
    assert r.returncode != 0, r.stdout[-3000:]  # the driver died (SIGKILL) midway
    first = _ids(out)
    assert 0 < len(first) < len(_expected_ids()) and max(first.values()) == 1, first
    assert list(out.glob(".tmp-*"))  # the writer that died mid-commit left its temp file

    # the resubmitted job's first two writers die right after committing their part (issue #16
    # item 8): Ray retries them, the retries write the same rows again, each id stays once
    r = cluster.submit("traces", work / "traces.yaml", env_vars={DIE_AFTER_COMMIT_ENV: "2"})
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert len(list(out.glob(DIED_MARKER + "part-*"))) == 2
    s = output_json(r.stdout)
    assert s["complete"] and s["input_rows"] == len(_expected_ids()) == s["ok"] + s["errors"]
    assert s["duplicates"] == 0 and s["duplicates_removed"] == 0  # the retries replaced their parts
    assert s["skipped_already_done"] == len(first) and s["processed_this_run"] == len(_expected_ids()) - len(first)
    ids = _ids(out)
    assert set(ids) == _expected_ids() and max(ids.values()) == 1  # every id exactly once
    assert not list(out.glob(".tmp-*"))
    assert "MapBatches(vLLMEngineStageUDF)" in r.stdout  # Ray Data progress is visible in the job log

    t = read_all(out)
    assert t.schema == TRACES
    rows = {r["id"]: r for r in t.to_pylist()}
    assert rows["empty"]["error"] == "empty prompt" and rows["number"]["error"].startswith("prompt is not a string")
    assert "maximum context length" in rows["long"]["error"] and rows["noprompt"]["error"] == "no 'prompt' field"
    assert rows["p3#dup1"]["error"].startswith("duplicate id")
    good = [rows[f"p{i}"] for i in range(N_GOOD)]
    assert all(g["status"] == "ok" and g["num_completion_tokens"] == len(g["completion_token_ids"]) for g in good)
    finished = [g for g in good if g["finished_think"]]
    assert len(finished) >= N_GOOD - 2
    correct = sum(g["answer"].split()[-2:-1] == [g["gold"]] for g in finished)  # "The answer is N ."
    assert correct >= 0.6 * len(finished), [g["answer"] for g in finished]

    r = cluster.submit("traces", work / "traces.yaml", "--limit", "5")  # first 5 rows, all done: a no-op
    s = output_json(r.stdout)
    assert r.returncode == 0 and s["complete"] and s["input_rows"] == 5 and s["processed_this_run"] == 0


def _variant(work: Path, stage: str, name: str, **changes) -> Path:
    cfg = json.loads((work / f"{stage}.yaml").read_text())
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split(".")
        for k in parents:
            node = node[k]
        node[last] = value
    (work / name).write_text(json.dumps(cfg))
    return work / name


def test_traces_error_rate_limit_and_refused_resume(cluster, work):
    """Issue #16 items 9 and 10 on the finished traces: a job over max_error_rate fails with a
    message after accounting for every row; a resume with another sampling temperature is refused
    before any work (no Ray started: a plain local run), naming the change."""
    r = cluster.submit("traces", _variant(work, "traces", "traces_strict.yaml", max_error_rate=0.1))
    s = output_json(r.stdout)
    assert r.returncode != 0 and s["complete"] and s["processed_this_run"] == 0
    n = len(_expected_ids())
    assert (
        s["errors"] == 5
        and f"5 of {n} rows are error rows ({100 * 5 / n:.1f}%), above max_error_rate 0.1" in s["failed"]
    )
    env = dict(os.environ, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)
    hot = _variant(work, "traces", "traces_hot.yaml", **{"sampling.temperature": 0.9})
    p = run_cmd([sys.executable, "-m", "pipelines.traces", "--config", hot], env=env, timeout=120)
    assert p.returncode == 2 and "config.sampling.temperature: 0.6 -> 0.9" in p.stderr, p.stderr[-3000:]
    assert "started a local Ray cluster" not in p.stderr


def test_labels_job_killed_midway_then_resubmitted(cluster, work):
    out = work / "labels"
    r = cluster.submit("labels", work / "labels.yaml", env_vars={"SPECEXIT_TEST_KILL_AFTER_PARTS": "1"})
    assert r.returncode != 0, r.stdout[-3000:]
    first = _ids(out)
    assert 0 < len(first) < len(_expected_ids()) and max(first.values()) == 1, first
    assert list(out.glob(".tmp-*"))
    # the resubmitted job's engine is killed after its first batch (issue #16 item 9): the actor
    # exits, Ray restarts it and retries the batch, no trace becomes an error row for it
    r = cluster.submit("labels", work / "labels.yaml", env_vars={KILL_ENGINE_ENV: "1"})
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert (out / KILLED_MARKER).exists(), r.stdout[-5000:]  # the hook killed the engine
    s = output_json(r.stdout)
    assert s["complete"] and s["ok"] + s["errors"] == s["input_rows"] == len(_expected_ids())
    ids = _ids(out)
    assert set(ids) == _expected_ids() and max(ids.values()) == 1 and not list(out.glob(".tmp-*"))
    assert s["skipped_already_done"] == len(first)
    probed = [tuple(map(int, m)) for m in re.findall(r"\[labels\] \d+ traces, (\d+) breaks, (\d+) probes", r.stdout)]
    assert probed and all(n == 2 * b for b, n in probed), probed  # k = 2 sampled answers for every break

    t = read_all(out)
    assert t.schema == LABELS
    rows = {r["id"]: r for r in t.to_pylist()}
    assert rows["long"]["error"].startswith("trace error: engine:")
    assert not [r["error"] for r in rows.values() if "probe generation failed" in (r["error"] or "")]
    ok = [r for r in rows.values() if r["status"] == "ok"]
    assert len(ok) >= N_GOOD - 2
    traces = {r["id"]: r for r in read_all(work / "traces").to_pylist()}
    for r in ok:
        n = len(r["completion_token_ids"])
        assert r["completion_token_ids"] == traces[r["id"]]["completion_token_ids"]
        assert all(len(r[k]) == n for k in ("confidence", "progress", "remaining", "log_remaining", "mask"))
        m = np.array(r["mask"])
        assert m.sum() == r["think_end"] - r["think_start"] > 0
        prog, rem = np.array(r["progress"]), np.array(r["remaining"])
        assert np.all(np.diff(prog[m]) > 0) and math.isclose(prog[m][-1], 1.0) and rem[m][-1] == 0
        assert np.all(prog[~m] == 0) and np.all(rem >= 0)
        np.testing.assert_allclose(r["log_remaining"], np.log1p(rem), rtol=1e-5)
        conf = np.array(r["confidence"])
        assert np.all((conf >= 0) & (conf <= 1)) and np.all(conf[~m] == 0)
        assert len(r["probe_outcomes"]) == len(r["boundaries"]) > 0
        assert all(o in (0.0, 0.5, 1.0) for o in r["probe_outcomes"])  # the share of 2 answers that are right
        assert set(np.unique(conf[m])) <= set(r["probe_outcomes"]) | {0.0}
    outcomes = [o for r in ok for o in r["probe_outcomes"]]
    assert 0.1 < np.mean(outcomes) < 0.95  # early probes fail, late ones (overthinking) succeed
    # the last probe of a correctly answered trace is almost always right already
    assert np.mean([r["probe_outcomes"][-1] for r in ok if r["final_correct"]]) > 0.8


def _events(work) -> list[dict]:
    p = work / "ray_train" / "t" / "specexit_events.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_train_job_logs_every_loss_term_and_exports_the_draft(cluster, work):
    """The draft training job through `ray job submit`: two Ray Train workers, a checkpoint every 5 steps, every
    loss term and the signal weights in its progress lines, the exported draft. (A worker lost mid-run, the
    restart and the resume from the last checkpoint: test_node_loss.py::test_training_loses_a_worker_node.)"""
    r = cluster.submit("train_draft", work / "train_draft.yaml")
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    logs = r.stdout
    s = output_json(logs)
    starts = [e for e in _events(work) if e["event"] == "start"]
    assert len(starts) == 1 and not starts[0]["resumed"], starts
    assert s["complete"] and s["step"] == STEPS and s["resumed_from_steps"] == []
    for term in LOG_TERMS:
        assert f"{term}=" in logs
    draft = work / "draft"
    assert (draft / "config.json").exists() and (draft / "model.safetensors").exists()


def test_runbook_job_commands_resume_the_chain(cluster, work):
    """docs/runbook.md's `ray job submit` lines run as written (bash, `RAY_ADDRESS` exported as the
    runbook does, `$CONFIGS` = this chain's configs) against this cluster once the stages above are
    done: the smoke job sees the cluster, and each stage resumes its finished output (every id is
    skipped, training finds its run finished and starts no workers) and reports it complete. The runbook's GPU configs
    differ only in values (test_cluster_runbook.py checks the command lines)."""
    env = dict(cluster.env, CONFIGS=str(work), RAY_ADDRESS=cluster.address)
    summaries = {}
    for cmd in job_commands():
        r = retry_no_agent(lambda: run_cmd(["bash", "-c", cmd], env=env, timeout=600))  # noqa: B023 (called at once)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-5000:]}\n{r.stderr[-3000:]}"
        if stage_of(cmd):
            summaries[stage_of(cmd)] = output_json(r.stdout)
        else:
            assert "'CPU': 8.0" in r.stdout, r.stdout[-2000:]  # the smoke job saw the cluster
    assert list(summaries) == ["traces", "labels", "train_draft"]
    for stage in ("traces", "labels"):
        s = summaries[stage]
        assert s["complete"] and s["processed_this_run"] == 0 and s["skipped_already_done"] == len(_expected_ids()), s
    s = summaries["train_draft"]
    assert s["complete"] and s["step"] == STEPS and s["skipped"] and s["worker_group_starts"] == 1, s
    assert (work / "draft" / "config.json").exists()


def test_rerun_with_same_name_resumes_locally(work):
    """No cluster address: the job starts its own local Ray; the run continues from its last step."""
    cfg = json.loads((work / "train_draft.yaml").read_text())
    cfg.update(steps=STEPS + 4, checkpoint_every=2, output=str(work / "draft2"))
    (work / "train_more.yaml").write_text(json.dumps(cfg))
    env = dict(os.environ, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)
    r, s = run_json(
        [sys.executable, "-m", "pipelines.train_draft", "--config", work / "train_more.yaml"], env=env, timeout=600
    )
    assert s["step"] == STEPS + 4 and s["resumed_from_steps"][-1] == STEPS
    assert f"resuming from step {STEPS}" in r.stdout + r.stderr
    assert json.loads((work / "draft2" / "specexit_train.json").read_text())["run_identity"]["stage"] == "train_draft"
    assert not list(work.glob(".draft2.*"))  # the export's staging folder was swapped in, nothing left
    cfg.update(lr=1e-4)  # resuming the run's checkpoints with another learning rate: refused before Ray starts
    (work / "train_other.yaml").write_text(json.dumps(cfg))
    p = run_cmd(
        [sys.executable, "-m", "pipelines.train_draft", "--config", work / "train_other.yaml"], env=env, timeout=120
    )
    assert p.returncode == 2 and "config.lr: 0.002 -> 0.0001" in p.stderr, p.stderr[-3000:]


def _spec_greedy(draft_dir, prompts, eos, *extra_args):
    """Greedy outputs of an EAGLE-3 engine, one list per `extra_args` (SamplingParams.extra_args)."""
    from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

    apply_cpu_defaults()
    from vllm import LLM, SamplingParams

    llm = LLM(
        **toy_llm_kwargs(
            TEACHER, speculative_config={"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": 3}
        )
    )
    res = []
    try:
        for x in extra_args or (None,):
            outs = llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                SamplingParams(temperature=0, max_tokens=200, extra_args=x),
                use_tqdm=False,
            )
            res.append([[t for t in o.outputs[0].token_ids if t != eos] for o in outs])
    finally:
        llm.llm_engine.engine_core.shutdown()
    return res


def test_exported_draft_runs_eagle3_in_vllm(work):
    """The exported SpecExit draft in vLLM with EAGLE-3 speculative decoding, two ways: directly
    through the SpecExit plugin, and stripped of its signal rows as a stock EAGLE-3 draft. Greedy
    speculative decoding equals plain greedy decoding (plugin: with the exit off; with it on, up to
    the exit point)."""
    from specexit_core.draft.checkpoint import convert, load_draft
    from specexit_core.toy.hf_generate import generate, load_teacher
    from specexit_core.toy.teacher_eval import prompt_ids

    draft = load_draft(work / "draft")
    assert draft.cfg.signals and draft.cfg.aux_layer_ids == (1, 2, 3)
    model, tok = load_teacher(TEACHER)
    close = tok.convert_tokens_to_ids("</think>")
    assert draft.cfg.token_ids == {
        "think_start": tok.convert_tokens_to_ids("<think>"),
        "think_end": close,
        "split": [tok.convert_tokens_to_ids("\n\n")],
    }
    prompts = [prompt_ids(tok, p) for p in problems("test", 4, seed=11)]
    want = generate(model, tok, prompts, max_new_tokens=200)
    try:
        import specexit_core.vllm_plugin  # noqa: F401  (registered through the vllm.general_plugins entry point)

        has_plugin = True
    except ImportError:
        has_plugin = False
    if has_plugin:
        off, on = _spec_greedy(work / "draft", prompts, tok.eos_token_id, {"specexit": False}, None)
        assert off == want
        for o, w in zip(on, want):
            cut = o.index(close) if close in o else len(o)
            assert o[:cut] == w[:cut]  # the exit only shortens the think segment
    stock = convert(work / "draft", work / "draft_stock", add_signals=False)
    assert _spec_greedy(stock, prompts, tok.eos_token_id)[0] == want
