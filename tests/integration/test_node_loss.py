"""Losing a node loses nothing (issue #43), serving: two engine replicas of one Serve app on two worker
nodes of a Ray cluster on this machine (tests/support/multinode.py), the proxy and the ingress on the head.
A node is lost the way a preempted spot VM loses it: SIGKILL to its raylet and every process under it at
once, under load. The batch jobs' drills (traces, labels, Ray Train, the head restart) are in
test_pipelines_jobs.py, on that module's chain.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from pathlib import Path

import pytest

from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems
from support.multinode import MultiNodeCluster

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=3)]


@pytest.fixture(scope="module")
def cluster():
    if not (TEACHER_DIR / "config.json").exists():
        pytest.skip(f"no toy teacher at {TEACHER_DIR} (run `specexit toy build`)")
    c = MultiNodeCluster()
    c.start()
    try:
        c.add_node("s1", 1)  # one engine replica per worker node
        c.add_node("s2", 1)
        yield c
    finally:
        c.stop()


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


def _node_of_replica(cluster: MultiNodeCluster, replica_id: str) -> str | None:
    from ray.util.state import list_actors

    alive = list_actors(address=cluster.address, filters=[("state", "=", "ALIVE")], limit=1000)
    return next((cluster.node_of(a.node_id) for a in alive if a.name and a.name.endswith(replica_id)), None)


def _actor_nodes(cluster: MultiNodeCluster, class_name: str) -> set[str]:
    from ray.util.state import list_actors

    alive = list_actors(address=cluster.address, filters=[("state", "=", "ALIVE")], limit=1000)
    return {cluster.node_of(a.node_id) or "head" for a in alive if class_name in a.class_name}


def _replica_nodes(cluster: MultiNodeCluster) -> collections.Counter:
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
