"""Losing a node loses nothing (issue #43): drills on a Ray cluster of several nodes on this machine
(tests/support/multinode.py). A node is lost the way a preempted spot VM loses it: SIGKILL to its
raylet and every process under it at once.

The head has no CPUs (drivers, the job supervisor, Serve's controller and proxy run there); two worker
nodes of 2 CPUs each carry the engines. Each drill loses the node that runs a vLLM engine while it
works, then gives the capacity back (a new node joins) for the next drill. The tests run in file order
and share one cluster.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.common.parts import read_all
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems
from support.cli import output_json
from support.multinode import MultiNodeCluster
from support.ray_head import retry_no_agent
from support.ray_train import LOG_TERMS, registered_checkpoint

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=6)]

N_ROWS = 24  # 12 parts of 2 rows: the node dies with most of them still to write
TRAIN_STEPS = 10  # a checkpoint every 5: the node dies after the first, the run resumes from it and logs step 10
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
    def submit(self, stage: str, config: Path, job_id: str) -> str:
        args = ["job", "submit", "--address", self.address, "--working-dir", ".", "--submission-id", job_id]
        args += ["--no-wait", "--", "python", "-m", f"pipelines.{stage}", "--config", str(config)]
        r = retry_no_agent(lambda: self.ray(*args))
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return job_id

    def stop_unfinished(self) -> None:
        """Stop every job still running (a failed drill's): the next drill needs its nodes' capacity."""
        client = self.jobs()
        for j in client.list_jobs():
            if j.submission_id and str(j.status) in ("PENDING", "RUNNING"):
                client.stop_job(j.submission_id)

    def engine_nodes(self) -> collections.Counter:
        """Worker node name -> Ray Data map actors (the vLLM engine stage's) on it whose engine is up."""
        return self.actor_nodes("ray::MapWorker(")


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
    d = tmp_path_factory.mktemp("nodeloss")
    rows = [
        {"id": f"p{i}", "prompt": p.prompt, "gold": str(p.answer)}
        for i, p in enumerate(problems("train", N_ROWS, seed=11))
    ]
    (d / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfgs = {
        "traces": {
            "input": {"kind": "jsonl", "path": str(d / "prompts.jsonl"), "gold_column": "gold"},
            "output": str(d / "traces"),
            "chunk_rows": 2,
            "engine": ENGINE,
            "sampling": {"temperature": 0.6, "max_tokens": 200, "seed": 0},
        },
        "labels": {
            "input": str(d / "traces"),
            "output": str(d / "labels"),
            "grader": "toy",
            # a row per part and longer probes: labeling is fast, and the node must die with parts still to write
            "probe_max_tokens": 40,
            "chunk_rows": 1,
            "engine": {**ENGINE, "batch_size": 1},
        },
        "train_draft": {
            "input": str(d / "labels"),
            "output": str(d / "draft"),
            "target": str(TEACHER_DIR),
            "run_name": "drill",
            "storage_path": str(d / "ray_train"),
            "num_workers": 2,
            "placement_strategy": "SPREAD",  # a worker on each node
            "use_gpu": False,
            "aux_layer_ids": [1, 2, 3],
            "draft_vocab_size": 160,
            "steps": TRAIN_STEPS,
            "batch_size": 4,
            "warmup_steps": 5,
            "log_every": 5,
            "checkpoint_every": 5,
            "max_failures": 2,
        },
    }
    for k, v in cfgs.items():
        (d / f"{k}.yaml").write_text(json.dumps(v))
    return d


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


def _raw_ids(folder: Path) -> collections.Counter:
    """Ids over every visible part file as it is on disk (read_all would hide duplicates)."""
    c = collections.Counter()
    for f in folder.glob("part-*.parquet"):
        c.update(pq.read_table(f, columns=["id"]).column("id").to_pylist())
    return c


def _drill(cluster: Cluster, stage: str, work: Path, spare: str) -> dict:
    """Run `stage` across both worker nodes, lose a node running an engine once the first part is
    written (or its engine has been up 2 s), let Ray's retries finish the job (or resubmit it once if
    the job failed), then give the capacity back (node `spare` joins)."""
    out = work / stage
    watcher = PartWatcher(out)
    watcher.start()
    job = cluster.submit(stage, work / f"{stage}.yaml", f"{stage}-drill-{time.time_ns()}")
    client, t0 = cluster.jobs(), time.time()
    live_since, checked, scanned, engines = None, 0.0, 0.0, collections.Counter()
    while True:  # the first part shows, or an engine has been up 2 s (labeling can finish within 3 s)
        if time.time() - scanned > 0.25:  # a scan of the process table: ~20 ms
            scanned, engines = time.time(), cluster.engine_nodes()
        live = [n for n in engines if cluster.nodes[n].alive]
        live_since = (live_since or time.time()) if live else None
        if live and (list(out.glob("part-*.parquet")) or time.time() - live_since > 2):
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
    resubmitted = status != "SUCCEEDED"
    if resubmitted:  # Ray's retries did not carry it: the resume must (skips the ids already written)
        job = cluster.submit(stage, work / f"{stage}.yaml", f"{stage}-resume-{time.time_ns()}")
        status = cluster.wait(job)
    logs = cluster.jobs().get_job_logs(job)
    watcher.stop.set()
    watcher.join()
    assert status == "SUCCEEDED", logs[-6000:]
    cluster.add_node(spare, 2)
    return {
        "victim": victim,
        "engines_before": dict(engines),
        "parts_before_loss": parts_before,
        "parts_total": len(list(out.glob("part-*.parquet"))),
        "lost_s": round(lost_s, 1),
        "resubmitted": resubmitted,
        "seconds": round(time.time() - t0, 1),
        "done_after_loss_s": round(time.time() - t_loss, 1),
        "summary": output_json(logs),
        "watcher": watcher,
        "logs": logs,
    }


def _check_exactly_once(out: Path, d: dict) -> None:
    expected = {f"p{i}" for i in range(N_ROWS)}
    raw = _raw_ids(out)
    assert set(raw) == expected and max(raw.values()) == 1, raw  # every input row once, on disk
    assert not list(out.glob(".tmp-*"))
    assert not d["watcher"].bad, d["watcher"].bad  # no visible part was ever partial
    s = d["summary"]
    assert s["complete"] and s["input_rows"] == N_ROWS == s["ok"] + s["errors"] and s["duplicates"] == 0
    assert d["parts_before_loss"] < d["parts_total"]  # the node died mid-job, parts still to write
    figures = {k: d[k] for k in ("victim", "parts_before_loss", "parts_total", "lost_s", "resubmitted", "seconds")}
    figures.update(
        gcs_marked_dead_s=figures.pop("lost_s"),
        job_done_after_loss_s=d["done_after_loss_s"],
        rows=s["input_rows"],
        ok=s["ok"],
        errors=s["errors"],
        rows_once=len(raw),
        part_files_read_while_running=len(d["watcher"].seen),
        unreadable_visible_parts=len(d["watcher"].bad),
        stale_tmp_removed=s["stale_tmp_removed"],
    )
    print(f"\nDRILL {s['stage']} " + json.dumps(figures))


def test_traces_job_loses_a_worker_node(cluster, work):
    d = _drill(cluster, "traces", work, spare="c")
    _check_exactly_once(work / "traces", d)
    assert d["summary"]["errors"] == 0  # the lost engine's rows were generated again, not turned into errors
    rows = read_all(work / "traces").to_pylist()
    assert all(r["status"] == "ok" and r["num_completion_tokens"] > 0 for r in rows)


def test_labels_job_loses_a_worker_node(cluster, work):
    d = _drill(cluster, "labels", work, spare="d")
    _check_exactly_once(work / "labels", d)
    rows = read_all(work / "labels").to_pylist()
    assert not [r["error"] for r in rows if r["error"] and "probe generation failed" in r["error"]]


def test_training_loses_a_worker_node(cluster, work):
    """Ray Train with a worker on each node; the node of worker 1 dies after the first registered
    checkpoint. The worker group restarts on the capacity left and resumes from that checkpoint; the
    loss curve goes on from there (no step is logged twice before the resume point); the draft loads.
    (The suite's one restart of a training run whose worker died: test_pipelines_jobs.py trains without one.)"""
    from safetensors.torch import load_file

    from pipelines.common.train_run import read_events

    run = work / "ray_train" / "drill"
    job = cluster.submit("train_draft", work / "train_draft.yaml", f"train-drill-{time.time_ns()}")
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
    assert s["complete"] and s["step"] == TRAIN_STEPS and s["resumed_from_steps"] == [starts[1]["step"]]
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
    assert steps_after == sorted(set(steps_after)) and steps_after[0] > resume and steps_after[-1] == TRAIN_STEPS, curve
    assert curve[1][0][1] < curve[0][0][1], curve  # below step 1's loss: the weights were restored
    assert all(f"{term}=" in second for term in LOG_TERMS)  # every loss term logged after the resume too
    cluster.add_node("e", 2)  # capacity returns for the next drill
    weights = load_file(str(work / "draft" / "model.safetensors"))
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


def test_head_restart_loses_the_job_table_and_a_resubmitted_job_resumes(cluster, work):
    """Without GCS fault tolerance a head restart loses Ray's job table (and every actor, placement group
    and Serve application): the new head knows nothing of the job that ran. Its Parquet output stays, and
    the same job submitted again resumes from it: the rows written before the loss are skipped and every
    row ends up written once. (Production: GCS fault tolerance on Redis, cluster/kuberay/, docs/runbook.md.)"""
    cfg = json.loads((work / "labels.yaml").read_text())
    out = work / "labels_head"
    cfg["output"] = str(out)
    (work / "labels_head.yaml").write_text(json.dumps(cfg))
    job = cluster.submit("labels", work / "labels_head.yaml", f"labels-head-{time.time_ns()}")
    client, t0, checked = cluster.jobs(), time.time(), 0.0
    while not list(out.glob("part-*.parquet")):
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
    assert 0 < len(before) < N_ROWS and max(before.values()) == 1, before
    again = cluster.submit("labels", work / "labels_head.yaml", f"labels-head-again-{time.time_ns()}")
    assert cluster.wait(again) == "SUCCEEDED", cluster.jobs().get_job_logs(again)[-6000:]
    s = output_json(cluster.jobs().get_job_logs(again))
    assert (
        s["complete"] and s["skipped_already_done"] == len(before) and s["processed_this_run"] == N_ROWS - len(before)
    )
    assert s["engines"] == 1 and "2 engine actors asked for, 1 started" in cluster.jobs().get_job_logs(again)
    raw = _raw_ids(out)
    assert set(raw) == {f"p{i}" for i in range(N_ROWS)} and max(raw.values()) == 1 and not list(out.glob(".tmp-*"))
    summary = {
        "rows_before_restart": len(before),
        "resumed_rows": s["processed_this_run"],
        "resumed_on": "one 2-CPU node, one engine",
        "head_back_and_job_done_s": round(time.time() - restarted, 1),
    }
    print("\nDRILL head_restart " + json.dumps(summary))


# -- serving: two engine replicas on two worker nodes, the proxy and the ingress on the head ---------------
SERVE_MODEL = "toy-drill"
N_REQUESTS, CONCURRENCY, KILL_AFTER = 300, 16, 60  # the node dies once KILL_AFTER requests are answered
MAX_TRIES = 8  # a client that retries on 503 / a stream's error event; more tries than that is a finding


def _serve_args(kv_dir: Path) -> dict:
    from specexit_core.kv_cache.settings import kv_transfer_config
    from specexit_core.vllm_env import engine_cores_bind
    from support.serve import toy_model_args

    engine = {
        "enable_prefix_caching": True,
        "block_size": 32,
        # the KV tier every replica shares (a directory standing in for shared storage); blocks are written
        # as the replicas compute them, so the lost node dies mid-write
        "kv_transfer_config": kv_transfer_config(str(kv_dir), host_bytes=64 << 20),
    }
    return {
        "model": toy_model_args(
            SERVE_MODEL,
            max_num_seqs=16,
            seed=0,
            engine_kwargs=engine,
            cpu={"kv_cache_gib": 1, "omp_threads_bind": engine_cores_bind()},
        ),
        "autoscaling": {"min_replicas": 2, "max_replicas": 2},
        # a prompt goes where its prefix's blocks are, unless the queues differ by more than 4 (the load)
        "routing": {"policy": "prefix_aware", "imbalanced_threshold": 4},
        "backpressure": {"max_ongoing_requests": 16, "max_queued_requests": 32, "retry_after_s": 1},
        "health": {"period_s": 1, "timeout_s": 10},
        "request_timeout_s": 60,
        "ingress_resources": {"node:__internal_head__": 0.001},  # the ingress beside the proxy, on the head
    }


def _body(i: int) -> dict:
    prompt = f"Compute from left to right : {i % 90 + 1} + {i % 7} * 3"
    return {"model": SERVE_MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "temperature": 0}


def _prefix() -> str:
    """224 tokens (7 KV blocks) of toy problems: the long start several requests share."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    ids = tok("\n".join(p.prompt for p in problems("test", 60, seed=5)))["input_ids"][:224]
    return tok.decode(ids)


def _shared_prefix_group(url: str, prefix: str) -> list[str]:
    """4 greedy requests sharing `prefix`, one after the other (only the prefix decides the route)."""
    import httpx

    out = []
    for q in ("1 + 2", "3 * 4", "9 - 5", "6 + 6"):
        body = {"model": SERVE_MODEL, "messages": [{"role": "user", "content": f"{prefix}\n{q}"}], "max_tokens": 16}
        r = httpx.post(url + "/v1/chat/completions", json={**body, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def _cache_stats() -> dict[str, dict]:
    """Each running engine replica's prefix-cache counters, by replica id (Serve's, in the actor's name)."""
    from serve_app.ray_llm import call_every_replica

    return {
        s["replica"]: s["prefix_cache"]
        for s in call_every_replica(f"SpecExitLLMServer:{SERVE_MODEL}", "drill", "specexit_stats")
    }


def _node_of_replica(cluster: Cluster, replica_id: str) -> str | None:
    from ray.util.state import list_actors

    alive = list_actors(address=cluster.address, filters=[("state", "=", "ALIVE")], limit=1000)
    return next((cluster.node_of(a.node_id) for a in alive if a.name and a.name.endswith(replica_id)), None)


def _actor_nodes(cluster: Cluster, class_name: str) -> set[str]:
    from ray.util.state import list_actors

    alive = list_actors(address=cluster.address, filters=[("state", "=", "ALIVE")], limit=1000)
    return {cluster.node_of(a.node_id) or "head" for a in alive if class_name in a.class_name}


def _replica_nodes(cluster: Cluster) -> collections.Counter:
    """Worker node name -> the drill app's engine replicas on it (Serve titles a replica's process
    `ray::ServeReplica:<app>:<deployment>`)."""
    return cluster.actor_nodes(f"ray::ServeReplica:drill:SpecExitLLMServer:{SERVE_MODEL}")


@pytest.fixture(scope="module")
def kv_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kvtier")


@pytest.fixture(scope="module")
def serving(cluster, kv_dir):
    import ray
    from ray import serve

    from serve_app.app import build_app
    from support.ports import free_port
    from support.serve import wait_generating, wait_running

    for name in [n for n, node in cluster.nodes.items() if node.alive]:
        cluster.lose(name)  # the batch drills' 2-CPU nodes go: from here one engine replica per node
    cluster.add_node("s1", 1)
    cluster.add_node("s2", 1)
    port = free_port()
    ray.init(address=cluster.gcs_address, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port, "location": "HeadOnly"})
        serve.run(build_app(_serve_args(kv_dir)), name="drill", blocking=False)
        wait_running(["drill"], 300)
        url = f"http://127.0.0.1:{port}"
        wait_generating(url, _body(0), None, 240)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


async def _ask(c, i: int, stream: bool) -> dict:
    """One request, retried after a 503 (waiting its Retry-After) or a stream's error event, as a client
    of this endpoint should; returns every attempt's outcome and the answer."""
    import httpx

    attempts = []
    for _ in range(MAX_TRIES):
        try:
            if not stream:
                r = await c.post("/v1/chat/completions", json=_body(i))
                attempts.append((r.status_code, r.headers.get("retry-after")))
                if r.status_code == 200:
                    return {"attempts": attempts, "text": r.json()["choices"][0]["message"]["content"] or ""}
            else:
                async with c.stream("POST", "/v1/chat/completions", json={**_body(i), "stream": True}) as r:
                    if r.status_code != 200:
                        await r.aread()
                        attempts.append((r.status_code, r.headers.get("retry-after")))
                    else:
                        text, error, done = "", None, False
                        async for line in r.aiter_lines():
                            if not line.startswith("data: "):
                                continue
                            if line == "data: [DONE]":
                                done = True
                                break
                            event = json.loads(line[6:])
                            if "error" in event:
                                error = event["error"]
                                continue  # read on: the stream must still end (no hang) after its error
                            delta = event["choices"][0]["delta"]
                            text += delta.get("content") or delta.get("reasoning_content") or ""
                        attempts.append(("stream-error", error["code"]) if error else ("stream", done))
                        if done and not error:
                            return {"attempts": attempts, "text": text}
        except httpx.HTTPError as e:  # a dropped connection or a hang past the client's timeout: a finding
            attempts.append((type(e).__name__, str(e)[:200]))
        last = attempts[-1]
        if last[0] == 503 and last[1]:
            await asyncio.sleep(int(last[1]))
        elif last[0] == "stream-error":
            await asyncio.sleep(1)
        else:
            break
    return {"attempts": attempts, "text": None}


def test_serving_loses_a_worker_node(cluster, serving):
    import httpx

    replicas = _replica_nodes(cluster)
    assert sorted(n for n in replicas.elements()) == ["s1", "s2"], replicas  # one replica per worker node
    # a shared prefix lands on one replica (prefix-aware routing), which writes its blocks to the KV tier:
    # that replica's node is the one lost
    prefix, before = _prefix(), _cache_stats()
    answers = _shared_prefix_group(serving, prefix)
    after = _cache_stats()
    (holder,) = [r for r in after if after[r]["hits"] > before[r]["hits"]]
    victim = _node_of_replica(cluster, holder)
    assert victim in ("s1", "s2"), victim
    # the prefix router's tree sits on the head (serve_app/routing.py): on a worker node, losing that node
    # left every request waiting for its deadline (503), for good
    assert _actor_nodes(cluster, "PrefixTreeActor") == {"head"}
    models, done, lost = [], [], {}

    async def load():
        sem = asyncio.Semaphore(CONCURRENCY)
        async with httpx.AsyncClient(base_url=serving, timeout=90, limits=httpx.Limits(max_connections=32)) as c:

            async def one(i):
                async with sem:
                    res = await _ask(c, i, stream=i % 2 == 1)
                done.append(res)
                return res

            async def poll_models():
                while len(done) < N_REQUESTS:
                    try:
                        models.append((await c.get("/v1/models", timeout=10)).status_code)
                    except httpx.HTTPError as e:
                        models.append(type(e).__name__)
                    await asyncio.sleep(0.25)

            async def lose_a_node():
                while len(done) < KILL_AFTER:
                    await asyncio.sleep(0.05)
                lost.update(victim=victim, at=time.time(), answered_before=len(done))
                lost["gcs_dead_s"] = await asyncio.to_thread(cluster.lose, victim)

            t0 = time.time()
            results, *_ = await asyncio.gather(
                asyncio.gather(*(one(i) for i in range(N_REQUESTS))), poll_models(), lose_a_node()
            )
            return results, time.time() - t0

    results, seconds = asyncio.run(load())
    firsts = collections.Counter(str(r["attempts"][0][0]) for r in results)
    every = [a for r in results for a in r["attempts"]]
    # no answer but 200 or a 503 that says when to retry; a stream cut by the loss ends with an error event
    assert all(a[0] in (200, 503, "stream", "stream-error") for a in every), [
        a for a in every if a[0] not in (200, 503, "stream", "stream-error")
    ][:5]
    assert all(a[1] for a in every if a[0] == 503)  # Retry-After on every 503
    assert all(a[1] == 503 for a in every if a[0] == "stream-error")
    assert all(r["text"] for r in results), [r["attempts"] for r in results if not r["text"]][:5]  # every answer
    hit = sum(1 for r in results if len(r["attempts"]) > 1)
    assert hit >= 1  # the loss did cut requests in flight (else the drill proved nothing)
    assert models and all(s == 200 for s in models), collections.Counter(map(str, models))

    # the shared prefix again, now on the surviving replica: its blocks come from the KV tier the lost replica
    # wrote (external hits), and the answers are the same as before the loss
    t_kv = time.time()
    while True:  # until Serve lists only the survivor (a call to the dead replica fails meanwhile)
        try:
            before = _cache_stats()
            if len(before) == 1:
                break
        except Exception:  # noqa: BLE001 -- the dead replica still listed
            pass
        assert time.time() - t_kv < 120, "Serve still lists the lost replica"
        time.sleep(1)
    assert _shared_prefix_group(serving, prefix) == answers
    after = _cache_stats()
    ((survivor, stats),) = after.items()
    external = stats["external_hits"] - before[survivor]["external_hits"]
    assert external >= 6 * 32, (before, after)  # at least the prefix's first 6 blocks, loaded from the tier

    # capacity returns: a node joins and Serve places the lost replica there
    t_join = time.time()
    cluster.add_node("s3", 1)
    while sorted(_replica_nodes(cluster).elements()) != sorted({"s1", "s2"} - {lost["victim"]} | {"s3"}):
        assert time.time() - t_join < 240, _replica_nodes(cluster)
        time.sleep(1)
    wait_s = time.time() - t_join
    r = httpx.post(serving + "/v1/chat/completions", json=_body(1), timeout=60)
    assert r.status_code == 200
    summary = {
        "requests": N_REQUESTS,
        "streaming": N_REQUESTS // 2,
        "concurrency": CONCURRENCY,
        "victim": lost["victim"],
        "answered_before_loss": lost["answered_before"],
        "gcs_marked_dead_s": round(lost["gcs_dead_s"], 1),
        "first_attempts": dict(firsts),
        "requests_retried": hit,
        "attempts_total": len(every),
        "answers": sum(1 for r in results if r["text"]),
        "models_polls": len(models),
        "seconds": round(seconds, 1),
        "replica_placed_again_after_join_s": round(wait_s, 1),
        "shared_prefix_tokens_from_kv_tier_on_survivor": external,
    }
    print("\nDRILL serving " + json.dumps(summary))


def test_kv_tier_blocks_read_back_whole_after_the_loss(serving, kv_dir):
    """Every block file the replicas wrote, the lost one's included, reads back whole (header, length,
    checksum); what the dead writer left half-written is a temp file no reader looks at."""
    from specexit_core.kv_cache import block_file
    from specexit_core.kv_cache.directory_tier import SUFFIX

    blocks = sorted(kv_dir.rglob(f"*{SUFFIX}"))
    bad = []
    for f in blocks:
        try:
            block_file.decode(f.read_bytes())
        except block_file.CorruptBlock as e:
            bad.append(f"{f.name}: {e}")
    leftovers = [f.name for f in kv_dir.rglob(".*.tmp")]
    assert len(blocks) >= 7 and not bad, (len(blocks), bad[:5])
    print(
        f"\nDRILL kv_tier {json.dumps({'blocks': len(blocks), 'corrupt': len(bad), 'temp_files_left': len(leftovers)})}"
    )
