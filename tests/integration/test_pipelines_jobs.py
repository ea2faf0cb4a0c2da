"""The pipeline jobs for real, and every way they fail, on one chain: `ray job submit` to a Ray cluster of a
head and two worker nodes on this machine (tests/support/multinode.py), vLLM CPU engines on the toy teacher.

Traces and labels: a first job's driver is SIGKILLed after its first part (a temp file left behind); the
job submitted again resumes it while its writers die right after committing (Ray retries them) or its
engine is killed, *and* a worker node running an engine is lost mid-job (issue #43: SIGKILL to the node's
raylet and everything under it). Every input row, bad rows included, ends up written exactly once, and no
part file is ever visible half-written. Ray Train loses a worker's node after the first checkpoint and
resumes from it. The runbook's `ray job submit` lines resume the finished chain, the head restarts (the job
table goes, the Parquet output stays), a driver with no cluster address resumes training locally, and the
exported draft runs EAGLE-3 in vLLM. (The serving drill: test_node_loss.py.)

The tests share the cluster and run in file order: each stage reads the previous one's output.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.common.parts import read_all
from pipelines.common.schemas import LABELS, TRACES
from pipelines.common.writer import DIE_AFTER_COMMIT_ENV, DIED_MARKER, KILL_AFTER_PARTS_ENV, STALL_AFTER_PARTS_ENV
from pipelines.labels.labeler import KILL_ENGINE_ENV, KILLED_MARKER
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems
from support.cli import output_json, run_json
from support.cli import run as run_cmd
from support.multinode import MultiNodeCluster
from support.ray_head import retry_no_agent
from support.ray_train import LOG_TERMS, registered_checkpoint
from support.runbook import job_commands, stage_of

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=12)]

N_GOOD = 22  # + 5 bad rows; 2-row parts: the node dies with most of them still to write
STEPS = 10  # draft training steps, a checkpoint every 5: the node dies after the first, the run resumes from it
ENGINE = {
    "model": str(TEACHER_DIR),
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 512,
    "max_num_seqs": 8,
    "concurrency": 2,  # one engine per worker node
    "batch_size": 2,
}


class Cluster(MultiNodeCluster):
    """The multi-node cluster plus the `ray job submit` calls these tests make."""

    def submit(self, stage: str, config: Path, *extra: str, env_vars: dict | None = None, wait: bool = True):
        """`ray job submit`; waits for the job (returns the CLI's result), or returns the job id (wait=False)."""
        job_id = f"{stage}-{time.time_ns()}"
        args = ["job", "submit", "--address", self.address, "--working-dir", ".", "--submission-id", job_id]
        args += ["--runtime-env-json", json.dumps({"env_vars": env_vars or {}})]
        args += [] if wait else ["--no-wait"]
        args += ["--", "python", "-m", f"pipelines.{stage}", "--config", str(config), *extra]
        r = retry_no_agent(lambda: self.ray(*args))
        if wait:
            return r
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return job_id

    def stop_unfinished(self) -> None:
        """Stop every job still running (a failed test's): the next test needs the nodes' capacity."""
        client = self.jobs()
        for j in client.list_jobs():
            if j.submission_id and str(j.status) in ("PENDING", "RUNNING"):
                client.stop_job(j.submission_id)

    def cpus(self) -> int:
        return sum(n.num_cpus for n in self.nodes.values() if n.alive)


@pytest.fixture(scope="module")
def cluster():
    if not (TEACHER_DIR / "config.json").exists():
        pytest.skip(f"no toy teacher at {TEACHER_DIR} (run `specexit toy build`)")
    c = Cluster()
    c.start()
    try:
        c.add_node("a", 2)
        c.add_node("b", 2)
        yield c
    finally:
        c.stop()


@pytest.fixture(autouse=True)
def no_job_left_running(request):
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").stop_unfinished()


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
    cfgs = {
        "traces": {
            "input": {"kind": "jsonl", "path": str(d / "prompts.jsonl"), "gold_column": "gold"},
            "output": str(d / "traces"),
            "chunk_rows": 2,
            "engine": ENGINE,
            "sampling": {"temperature": 0.6, "max_tokens": 400, "seed": 0},
        },
        "labels": {
            "input": str(d / "traces"),
            "output": str(d / "labels"),
            "chunk_rows": 1,  # a row per part: labeling is fast, and the node must die with parts still to write
            "grader": "toy",
            "probe_max_tokens": 12,
            # two probes per break, sampled (the demos probe greedily, once)
            "probe_sampling": {"samples": 2, "temperature": 0.6},
            # the labels test SIGKILLs the engine core's processes: they must be processes of their own
            "engine": {**ENGINE, "batch_size": 1, "max_num_seqs": 16, "engine_core": "process"},
        },
        "train_draft": {
            "input": str(d / "labels"),
            "output": str(d / "draft"),
            "target": str(TEACHER_DIR),
            "run_name": "t",
            "storage_path": str(d / "ray_train"),
            "num_workers": 2,
            "placement_strategy": "SPREAD",  # a worker on each node
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


def _raw_ids(folder: Path) -> collections.Counter:
    """Ids over every visible part file as it is on disk (read_all would hide duplicates)."""
    c = collections.Counter()
    for f in folder.glob("part-*.parquet"):
        c.update(pq.read_table(f, columns=["id"]).column("id").to_pylist())
    return c


def _expected_ids() -> set[str]:
    return {f"p{i}" for i in range(N_GOOD)} | {"empty", "number", "long", "noprompt", "p3#dup1"}


def _killed_midway(cluster: Cluster, stage: str, work: Path) -> collections.Counter:
    """The stage's first job, its driver SIGKILLed after the first part it writes (one engine: the job
    dies before a second would matter); returns the ids written, each once, some but not all."""
    config = _variant(work, stage, f"{stage}_first.yaml", **{"engine.concurrency": 1})  # a run-only key
    r = cluster.submit(stage, config, env_vars={KILL_AFTER_PARTS_ENV: "1"})
    assert r.returncode != 0, r.stdout[-3000:]  # the driver died (SIGKILL) midway
    first = _raw_ids(work / stage)
    assert 0 < len(first) < len(_expected_ids()) and max(first.values()) == 1, first
    assert list((work / stage).glob(".tmp-*"))  # the writer that died mid-commit left its temp file
    return first


class PartWatcher(threading.Thread):
    """Opens every part file the moment it is visible, for the whole job: a part a dying writer left
    half-written would fail to read (or read short) here even if the job later replaced it."""

    def __init__(self, folder: Path):
        super().__init__(daemon=True)
        self.folder, self.seen, self.bad, self.stop = folder, {}, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            for f in sorted(self.folder.glob("part-*.parquet")) if self.folder.is_dir() else []:
                if f.name in self.seen:
                    continue
                try:
                    meta = pq.read_metadata(f)
                    t = pq.read_table(f)
                    assert t.num_rows == meta.num_rows > 0
                    self.seen[f.name] = t.num_rows
                except FileNotFoundError:
                    pass  # replaced by a retry of the same ids between glob and open
                except Exception as e:  # noqa: BLE001 -- any unreadable visible part is the finding
                    self.bad.append(f"{f.name}: {e!r}")
                    self.seen[f.name] = -1
            time.sleep(0.05)


def _resume_losing_a_node(cluster: Cluster, stage: str, work: Path, spare: str, env_vars: dict) -> dict:
    """Submit `stage` again (with the failures `env_vars` inject) across both worker nodes, lose a node
    running an engine once the job writes its first part (or its engine has been up 2 s), let Ray's
    retries finish the job (or resubmit it once if it failed), then give the capacity back (node `spare`)."""
    out = work / stage
    parts_at_start = len(list(out.glob("part-*.parquet")))
    watcher = PartWatcher(out)
    watcher.start()
    job = cluster.submit(stage, work / f"{stage}.yaml", env_vars=env_vars, wait=False)
    client, t0 = cluster.jobs(), time.time()
    live_since, checked, scanned, engines = None, 0.0, 0.0, collections.Counter()
    while True:  # a new part shows, or an engine has been up 2 s (labeling can finish within 3 s)
        if time.time() - scanned > 0.25:  # a scan of the process table: ~20 ms
            scanned, engines = time.time(), cluster.actor_nodes("ray::MapWorker(")  # the engine stage's actors
        live = [n for n in engines if cluster.nodes[n].alive]
        live_since = (live_since or time.time()) if live else None
        new_part = len(list(out.glob("part-*.parquet"))) > parts_at_start
        if live and (new_part or time.time() - live_since > 2):
            break
        if time.time() - checked > 1:  # the job still runs (a failed one would leave this loop waiting)
            checked, status = time.time(), str(client.get_job_status(job))
            assert time.time() - t0 < 300 and status in ("PENDING", "RUNNING"), client.get_job_logs(job)[-6000:]
        time.sleep(0.05)
    victim = max(live, key=lambda n: engines[n])
    parts_before = len(list(out.glob("part-*.parquet")))
    t_loss = time.time()
    lost_s = cluster.lose(victim)
    status = cluster.wait(job)
    logs = client.get_job_logs(job)
    resubmitted = status != "SUCCEEDED"
    if resubmitted:  # Ray's retries did not carry it: the resume must (skips the ids already written)
        job = cluster.submit(stage, work / f"{stage}.yaml", env_vars=env_vars, wait=False)
        status = cluster.wait(job)
        logs += client.get_job_logs(job)
    watcher.stop.set()
    watcher.join()
    assert status == "SUCCEEDED", logs[-6000:]
    cluster.add_node(spare, 2)
    d = {
        "victim": victim,
        "parts_before_loss": parts_before,
        "parts_total": len(list(out.glob("part-*.parquet"))),
        "lost_s": round(lost_s, 1),
        "resubmitted": resubmitted,
        "seconds": round(time.time() - t0, 1),
        "done_after_loss_s": round(time.time() - t_loss, 1),
        "summary": output_json(logs),
        "logs": logs,
    }
    _check_exactly_once(out, d, watcher)
    return d


def _check_exactly_once(out: Path, d: dict, watcher: PartWatcher) -> None:
    raw = _raw_ids(out)
    assert set(raw) == _expected_ids() and max(raw.values()) == 1, raw  # every input row once, on disk
    assert not list(out.glob(".tmp-*"))
    assert not watcher.bad, watcher.bad  # no visible part was ever partial
    s = d["summary"]
    assert s["complete"] and s["input_rows"] == len(_expected_ids()) == s["ok"] + s["errors"]
    assert s["duplicates"] == 0
    assert d["parts_before_loss"] < d["parts_total"]  # the node died mid-job, parts still to write
    figures = {k: d[k] for k in ("victim", "parts_before_loss", "parts_total", "lost_s", "resubmitted", "seconds")}
    figures.update(
        gcs_marked_dead_s=figures.pop("lost_s"),
        job_done_after_loss_s=d["done_after_loss_s"],
        rows=s["input_rows"],
        ok=s["ok"],
        errors=s["errors"],
        rows_once=len(raw),
        part_files_read_while_running=len(watcher.seen),
        unreadable_visible_parts=len(watcher.bad),
        stale_tmp_removed=s["stale_tmp_removed"],
    )
    print(f"\nDRILL {s['stage']} " + json.dumps(figures))


def test_traces_job_killed_then_resumed_losing_a_worker_node(cluster, work):
    out = work / "traces"
    first = _killed_midway(cluster, "traces", work)
    # the resubmitted job's first two writers die right after committing their part (issue #16 item 8): Ray
    # retries them, the retries write the same rows again; and a worker node running an engine dies
    d = _resume_losing_a_node(cluster, "traces", work, spare="c", env_vars={DIE_AFTER_COMMIT_ENV: "2"})
    s = d["summary"]
    assert len(list(out.glob(DIED_MARKER + "part-*"))) == 2
    assert s["duplicates_removed"] == 0  # the retries replaced their parts
    assert s["errors"] == 5  # the bad rows; the lost engine's rows were generated again, not turned into errors
    if not d["resubmitted"]:
        assert s["skipped_already_done"] == len(first) and s["processed_this_run"] == len(_expected_ids()) - len(first)
    assert "MapBatches(vLLMEngineStageUDF)" in d["logs"]  # Ray Data progress is visible in the job log

    t = read_all(out)
    assert t.schema == TRACES
    rows = {r["id"]: r for r in t.to_pylist()}
    assert rows["empty"]["error"] == "empty prompt" and rows["number"]["error"].startswith("prompt is not a string")
    assert "maximum context length" in rows["long"]["error"] and rows["noprompt"]["error"] == "no 'prompt' field"
    assert rows["p3#dup1"]["error"].startswith("duplicate id")
    good = [rows[f"p{i}"] for i in range(N_GOOD)]
    assert all(g["status"] == "ok" and g["num_completion_tokens"] == len(g["completion_token_ids"]) > 0 for g in good)
    finished = [g for g in good if g["finished_think"]]
    assert len(finished) >= N_GOOD - 2
    correct = sum(g["answer"].split()[-2:-1] == [g["gold"]] for g in finished)  # "The answer is N ."
    assert correct >= 0.6 * len(finished), [g["answer"] for g in finished]

    r = cluster.submit("traces", work / "traces.yaml", "--limit", "5")  # first 5 rows, all done: a no-op
    s = output_json(r.stdout)
    assert r.returncode == 0 and s["complete"] and s["input_rows"] == 5 and s["processed_this_run"] == 0


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


def test_labels_job_killed_then_resumed_losing_a_worker_node(cluster, work):
    out = work / "labels"
    first = _killed_midway(cluster, "labels", work)
    # the resubmitted job's engine is killed after its first batch (issue #16 item 9): the actor exits, Ray
    # restarts it and retries the batch; and a worker node running an engine dies. No trace becomes an error
    # row for either.
    d = _resume_losing_a_node(cluster, "labels", work, spare="d", env_vars={KILL_ENGINE_ENV: "1"})
    s, logs = d["summary"], d["logs"]
    assert (out / KILLED_MARKER).exists(), logs[-5000:]  # the hook killed the engine
    if not d["resubmitted"]:
        assert s["skipped_already_done"] == len(first)
    probed = [tuple(map(int, m)) for m in re.findall(r"\[labels\] \d+ traces, (\d+) breaks, (\d+) probes", logs)]
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


def test_training_loses_a_worker_node(cluster, work):
    """The draft training job through `ray job submit`, a Ray Train worker on each node; the node of worker 1
    dies after the first registered checkpoint. The worker group restarts on the capacity left and resumes
    from that checkpoint; the loss curve goes on from there (no step logged twice before the resume point),
    every loss term and the signal weights in its progress lines; the exported draft loads."""
    from safetensors.torch import load_file

    from pipelines.common.train_run import read_events

    run = work / "ray_train" / "t"
    job = cluster.submit("train_draft", work / "train_draft.yaml", wait=False)
    client, t0 = cluster.jobs(), time.time()
    while registered_checkpoint(run) is None or not (run / "worker-1.pid").exists():
        status = str(client.get_job_status(job))
        assert time.time() - t0 < 300 and status in ("PENDING", "RUNNING"), client.get_job_logs(job)[-6000:]
        time.sleep(0.25)
    pids = {r: int((run / f"worker-{r}.pid").read_text()) for r in (0, 1)}
    nodes = {r: cluster.node_of_pid(p) for r, p in pids.items()}
    assert nodes[0] and nodes[1] and nodes[0] != nodes[1], nodes  # SPREAD: one worker per node
    t_loss = time.time()
    lost_s = cluster.lose(nodes[1])
    status = cluster.wait(job)
    logs = cluster.jobs().get_job_logs(job)
    assert status == "SUCCEEDED", logs[-6000:]
    s = output_json(logs)
    starts = [e for e in read_events(run / "specexit_events.jsonl") if e["event"] == "start"]
    assert len(starts) == 2 and not starts[0]["resumed"] and starts[1]["resumed"] and starts[1]["step"] >= 5, starts
    assert s["complete"] and s["step"] == STEPS and s["resumed_from_steps"] == [starts[1]["step"]]
    # the loss curve: the first attempt logs from step 1; after "resuming from step S" the steps go on past S
    # in order, up to the end, and the loss starts from where the checkpoint left it, not from scratch
    first, _, second = logs.partition(f"resuming from step {starts[1]['step']}")
    curve = [
        [(int(a), float(b)) for a, b in re.findall(r"\[train\] step (\d+)/\d+ .*?token_loss=([\d.]+)", part)]
        for part in (first, second)
    ]
    resume = starts[1]["step"]
    assert curve[0] and curve[0][0][0] == 1 and curve[1], curve
    steps_after = [step for step, _ in curve[1]]
    assert steps_after == sorted(set(steps_after)) and steps_after[0] > resume and steps_after[-1] == STEPS, curve
    assert curve[1][0][1] < curve[0][0][1], curve  # below step 1's loss: the weights were restored
    for term in LOG_TERMS:  # every loss term logged, before the loss and after the resume
        assert f"{term}=" in first and f"{term}=" in second, term
    cluster.add_node("e", 2)  # capacity returns for the tests after this one
    draft = work / "draft"
    assert (draft / "config.json").exists()
    weights = load_file(str(draft / "model.safetensors"))
    assert weights and all(bool(t.isfinite().all()) for t in weights.values())
    print(
        "\nDRILL training "
        + json.dumps(
            {
                "workers_on": nodes,
                "lost": nodes[1],
                "gcs_marked_dead_s": round(lost_s, 1),
                "resumed_from_step": resume,
                "resumed_after_loss_s": round(starts[1]["time"] - t_loss, 1),
                "job_done_after_loss_s": round(time.time() - t_loss, 1),
                "token_loss": curve,
                "seconds": round(time.time() - t0, 1),
            }
        )
    )


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
        else:  # the smoke job saw the cluster: the worker nodes' CPUs (the head has none)
            assert f"'CPU': {float(cluster.cpus())}" in r.stdout, r.stdout[-2000:]
    assert list(summaries) == ["traces", "labels", "train_draft"]
    for stage in ("traces", "labels"):
        s = summaries[stage]
        assert s["complete"] and s["processed_this_run"] == 0 and s["skipped_already_done"] == len(_expected_ids()), s
    s = summaries["train_draft"]
    # no worker group started: the two starts are the training test's (the first and the one after the loss)
    assert s["complete"] and s["step"] == STEPS and s["skipped"] and s["worker_group_starts"] == 2, s
    assert (work / "draft" / "config.json").exists()


def test_head_restart_loses_the_job_table_and_a_resubmitted_job_resumes(cluster, work):
    """Without GCS fault tolerance a head restart loses Ray's job table (and every actor, placement group
    and Serve application): the new head knows nothing of the job that ran. Its Parquet output stays, and
    the same job submitted again resumes from it: the rows written before the loss are skipped and every
    row ends up written once. (Production: GCS fault tolerance on Redis, cluster/kuberay/, docs/runbook.md.)"""
    out = work / "labels_head"
    config = _variant(work, "labels", "labels_head.yaml", output=str(out))
    # the job's writers wait once 2 parts are written (STALL_AFTER_PARTS_ENV): the head goes while the job
    # has rows left to write (the toy's labeling wrote every part within the second a restart takes)
    job = cluster.submit("labels", config, env_vars={STALL_AFTER_PARTS_ENV: "2"}, wait=False)
    client, t0, checked = cluster.jobs(), time.time(), 0.0
    while len(list(out.glob("part-*.parquet"))) < 2:
        if time.time() - checked > 1:
            checked, status = time.time(), str(client.get_job_status(job))
            assert time.time() - t0 < 300 and status in ("PENDING", "RUNNING"), client.get_job_logs(job)[-6000:]
        time.sleep(0.05)
    cluster.restart_head()
    restarted = time.time()
    # one 2-CPU node comes back: the resubmitted job's two engines do not both fit beside the tasks that read
    # its input (each engine holds a CPU); the job starts one (pipelines/common/runtime.py, engines_that_fit),
    # where two waited forever for a CPU to read with
    cluster.add_node("h1", 2)
    assert job not in {j.submission_id for j in cluster.jobs().list_jobs()}  # the job table went with the head
    before = _raw_ids(out)
    assert 0 < len(before) < len(_expected_ids()) and max(before.values()) == 1, before
    again = cluster.submit("labels", config, wait=False)
    assert cluster.wait(again) == "SUCCEEDED", cluster.jobs().get_job_logs(again)[-6000:]
    logs = cluster.jobs().get_job_logs(again)
    s = output_json(logs)
    assert s["complete"] and s["skipped_already_done"] == len(before)
    assert s["processed_this_run"] == len(_expected_ids()) - len(before)
    assert s["engines"] == 1 and "2 engine actors asked for, 1 started" in logs
    raw = _raw_ids(out)
    assert set(raw) == _expected_ids() and max(raw.values()) == 1 and not list(out.glob(".tmp-*"))
    summary = {
        "rows_before_restart": len(before),
        "resumed_rows": s["processed_this_run"],
        "resumed_on": "one 2-CPU node, one engine",
        "head_back_and_job_done_s": round(time.time() - restarted, 1),
    }
    print("\nDRILL head_restart " + json.dumps(summary))


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
            str(TEACHER_DIR),
            speculative_config={"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": 3},
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
    model, tok = load_teacher(str(TEACHER_DIR))
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
