"""Prefix-aware routing for real (#15 item 3): two toy engine replicas with prefix caching behind the
prefix router (`routing.policy: prefix_aware`). Requests that share a long prefix all land on one replica,
whose prefix cache then hits; a second prefix goes to the other replica; requests without text to match
(detokenize, an empty chat message, a token-id prompt) are still routed. Each replica's prefix-cache and
preemption counts (`specexit_stats`, read from every replica) add up, and the same counters reach Ray's
Prometheus endpoint, tagged with the replica.

The engines get few KV blocks (`num_gpu_blocks_override`), so that concurrent long generations on one
replica make its scheduler preempt."""

import asyncio
import re
import time

import httpx
import pytest

from serve_app.cache_metrics import METRICS
from serve_app.ray_llm import call_every_replica
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems
from support.serve import ServeApp, running_serve, toy_model_args, wait_generating

# routing by prefix is decided by text, not timing: the parallel pass is fine
pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=1.5)]

MODEL = "toy-prefix"
APP = "prefix"
SERVER = f"SpecExitLLMServer:{MODEL}"
BLOCK = 32  # the CPU backend's smallest block size: a prefix hit is counted in whole blocks
BLOCKS = 40  # KV blocks per engine: 1280 tokens, one toy context (512) and some
PREFIX_TOKENS = 224  # 7 blocks; prompt + generation stay within the toy's 512 positions
N = 5  # requests per prefix
LONG = 230  # tokens each concurrent long generation writes: 6 x ~16 blocks > BLOCKS -> preemptions


@pytest.fixture(scope="module")
def base():
    engine = {"enable_prefix_caching": True, "block_size": BLOCK, "num_gpu_blocks_override": BLOCKS}
    args = {
        "model": toy_model_args(MODEL, max_num_seqs=8, seed=0, engine_kwargs=engine),
        "autoscaling": {"min_replicas": 2, "max_replicas": 2},
        "routing": {"policy": "prefix_aware"},
        "backpressure": {"max_ongoing_requests": 8, "max_queued_requests": 16},
        "request_timeout_s": 120,
    }
    with running_serve(ServeApp(APP, args)) as url:
        _wait_ready(url)
        yield url


def _wait_ready(url: str, timeout: float = 240) -> None:
    wait_generating(url, _chat("1 + 1", 2), timeout=timeout)


def _chat(text: str, max_tokens: int, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **extra}


def _prefix(seed: int) -> str:
    """Toy problems, one per line, cut to PREFIX_TOKENS tokens: a long shared start of a prompt."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    ids = tok("\n".join(p.prompt for p in problems("test", 60, seed=seed)))["input_ids"][:PREFIX_TOKENS]
    return tok.decode(ids)


def _per_replica() -> dict[str, dict]:
    """Every replica's specexit_stats, by replica id."""
    stats = call_every_replica(SERVER, APP, "specexit_stats")
    assert len(stats) == 2, stats
    return {s["replica"]: s for s in stats}


def _delta(after: dict, before: dict, key: str) -> dict[str, int]:
    return {r: after[r][key] - before[r][key] for r in after}


def _hits(after: dict, before: dict) -> dict[str, int]:
    return {r: after[r]["prefix_cache"]["hits"] - before[r]["prefix_cache"]["hits"] for r in after}


def _send_group(url: str, prefix: str, questions: list[str]) -> None:
    """One after the other (no load difference): only the prefix decides."""
    for q in questions:
        r = httpx.post(url + "/v1/chat/completions", json=_chat(f"{prefix}\n{q}", 4), timeout=60)
        assert r.status_code == 200, r.text


def _only_one(delta: dict[str, int]) -> str:
    """The one replica with a non-zero delta (fails if both or neither have one)."""
    (replica,) = [r for r, d in delta.items() if d]
    return replica


def test_a_shared_prefix_lands_on_one_replica_and_hits_its_cache(base):
    qs = [p.prompt for p in problems("test", 2 * N, seed=99)]
    s0 = _per_replica()
    _send_group(base, _prefix(1), qs[:N])
    s1 = _per_replica()
    a = _only_one(_delta(s1, s0, "requests"))
    assert _delta(s1, s0, "requests")[a] == N
    # the first request of the prefix fills the cache, the N - 1 others find most of its 7 blocks there
    # (with an EAGLE draft vLLM leaves the last matched block out)
    assert _hits(s1, s0)[a] >= (N - 1) * 5 * BLOCK, _hits(s1, s0)
    assert _only_one(_hits(s1, s0)) == a

    _send_group(base, _prefix(2), qs[N:])  # little in common with the first: the emptier replica
    s2 = _per_replica()
    b = _only_one(_delta(s2, s1, "requests"))
    assert b != a and _delta(s2, s1, "requests")[b] == N
    assert _only_one(_hits(s2, s1)) == b
    print(f"prefix 1 -> {a}: hits {_hits(s1, s0)}; prefix 2 -> {b}: hits {_hits(s2, s1)}")


def test_requests_without_text_to_match_are_routed(base):
    """The stock router raised for these (no messages/prompt) or divided by zero (empty text), and Serve
    retried the routing until the deadline: the client got a 503 after request_timeout_s."""
    cases = {  # path, body, the engine's answer
        "/detokenize": ({"model": MODEL, "tokens": [5, 6, 7]}, 400),  # the toy engine serves no tokenization task
        "/v1/chat/completions": (_chat("", 2), 200),
        "/v1/completions": ({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2}, 200),
    }
    for path, (body, status) in cases.items():
        t0 = time.time()
        r = httpx.post(base + path, json=body, timeout=30)
        assert r.status_code == status, (path, r.status_code, r.text)
        assert time.time() - t0 < 20, path
        if status == 400:  # answered by the engine replica, i.e. routed to one
            assert "does not support the 'tokenization' task" in r.json()["error"]["message"], r.text


def test_preemptions_are_counted_where_they_happen(base):
    prefix = _prefix(1)
    s0 = _per_replica()

    async def burst():
        async with httpx.AsyncClient(base_url=base, timeout=120) as c:
            bodies = [_chat(f"{prefix}\nq{i}", LONG, ignore_eos=True) for i in range(6)]
            return await asyncio.gather(*(c.post("/v1/chat/completions", json=b) for b in bodies))

    for r in asyncio.run(burst()):
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == LONG  # a preempted request still finishes whole
    s1 = _per_replica()
    pre = {r: s1[r]["prefix_cache"]["preemptions"] - s0[r]["prefix_cache"]["preemptions"] for r in s1}
    a = _only_one(_delta(s1, s0, "requests"))  # the prefix's replica took all six
    assert pre[a] > 0, pre
    print(f"6 long generations on {a}: {pre[a]} preemptions")


def test_counters_reach_prometheus_tagged_by_replica(base):
    """Ray's metrics agent exports the replicas' counters (`ray_<name>`, tags model and replica); it
    flushes every few seconds."""
    import ray

    stats = _per_replica()
    port = ray._private.worker._global_node.metrics_export_port
    want_hits = {r: s["prefix_cache"]["hits"] for r, s in stats.items()}
    deadline, seen = time.time() + 60, {}
    while time.time() < deadline:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        seen = _samples(text)
        got = {r: v for (name, r), v in seen.items() if name == "specexit_prefix_cache_hits"}
        if got == {r: h for r, h in want_hits.items() if h} and any(n == "specexit_preemptions" for n, _ in seen):
            break
        time.sleep(2)
    names = {n for n, _ in seen}
    assert {"specexit_prefix_cache_queries", "specexit_prefix_cache_hits", "specexit_preemptions"} <= names, names
    hits = {r: v for (n, r), v in seen.items() if n == "specexit_prefix_cache_hits"}
    assert hits == {r: h for r, h in want_hits.items() if h}  # the same numbers, per replica
    assert sum(v for (n, _), v in seen.items() if n == "specexit_preemptions") > 0


_SAMPLE = re.compile(r"^ray_(specexit_[a-z_]+?)(?:_total)?\{([^}]*)\}\s+([0-9.e+]+)$")


def _samples(text: str) -> dict[tuple[str, str], float]:
    """(metric name, replica) -> value of this model's specexit counters in a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in METRICS:  # e.g. a `_created` sample
            continue
        tags = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if tags.get("model") == MODEL:
            out[(m.group(1), tags.get("replica", ""))] = float(m.group(3))
    return out
