"""`specexit bench serve`: what the Serve path costs next to the engine (issue #18 item 8).

The same fixed requests (same prompt token ids, greedy, `max_tokens` fixed and `ignore_eos`, so every
request makes the engine do exactly the same work) run two ways in one process, one after the other:

* direct: vLLM `AsyncLLM` in this process, with the engine arguments the Serve replica gets
  (`serve_app.app.engine_kwargs`), non-streaming (`FINAL_ONLY` outputs, as vLLM's OpenAI layer asks
  for a non-streamed answer);
* serve: the Serve app (`serve_app.app.build_app`, a local Ray cluster of its own) over HTTP with the
  official `openai` client: HTTP proxy -> ingress replica -> engine replica (vLLM's OpenAI layer,
  SpecExit telemetry) -> the same engine.

at each concurrency level (default 1 and 16). Per path and level: requests/s, tokens/s, latency, and
CPU time per request by process role. The ratio is serve requests/s over direct requests/s.

Engine time per request (`engine_ms_per_request`) is the direct path's wall time per request at that
concurrency: what one request costs when nothing but the engine and its in-process front end runs.
Serve's cost is only small next to it when it is large (>= 100 ms is the issue's condition); the
default model set (the long writer, 384 tokens) is chosen so that it is, and every row prints it.

CPU time (why psutil on the process tree): on a CPU box the Serve processes and the engine share the
same cores, so every CPU-ms the path spends outside the engine is taken from the engine. This process
and all its descendants (Ray's raylet, GCS and workers, the Serve actors, vLLM's engine processes) are
sampled with psutil before and after each timed run; the user + system CPU delta of each process is
summed by role, told apart by process title:
  engine      vLLM's EngineCore and worker processes (the engine itself; excluded from "outside")
  frontend    direct path: this process (AsyncLLM's front end: detokenizing, output processing)
  client      serve path: this process (the openai client: not the endpoint's cost, reported apart)
  proxy / ingress / replica / controller   the Serve HTTP proxy, SpecExitIngress, SpecExitLLMServer
              (vLLM's OpenAI layer + AsyncLLM's front end + our telemetry), the Serve controller
  ray         every other process of the local cluster (raylet, GCS, idle workers, log monitor)
`outside_engine_cpu_ms_per_request` = all roles but `engine` and `client`, per request. The serve
row's `added_cpu_ms_per_request` is that minus the direct row's: what the Serve path adds per
request. Other users' processes on the machine are not counted (they are not descendants), but they
do slow both paths: compare the rows' load averages.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve_app.bench import percentile

TOY_CONFIG = Path(__file__).with_name("toy_cpu.yaml")
ENGINE_ROLE, CLIENT_ROLE = "engine", "client"
# process title fragments -> role (first match wins; a process matching none is "ray")
ROLE_MARKERS = (
    ("EngineCore", ENGINE_ROLE),
    ("VLLM::Worker", ENGINE_ROLE),
    ("VllmWorker", ENGINE_ROLE),
    ("ProxyActor", "proxy"),
    ("SpecExitIngress", "ingress"),
    ("SpecExitLLMServer", "replica"),
    ("ServeController", "controller"),
)


@dataclass(frozen=True)
class ModelSet:
    name: str
    api: str  # "chat" (prompt = a user message, the server's chat template) or "completions" (token ids)
    max_tokens: int  # default output length: every request generates exactly this many tokens


MODEL_SETS = {
    # the shipped toy endpoint (teacher + SpecExit draft, k = 3): ~300 tokens fit its 512 positions
    "toy": ModelSet("toy", "chat", 300),
    # the long writer (3-layer Qwen3, no draft): 256 tokens took ~100 ms per request at c = 16 on 2 quiet cores;
    # 384 keep the engine time per request clearly above 100 ms
    "long-writer": ModelSet("long-writer", "completions", 384),
}


def app_args(model_set: str) -> dict:
    """The Serve app's args: serve_app/toy_cpu.yaml with auth off; the long writer swaps its model block."""
    from specexit_core.typed_config import read_yaml

    args = dict(read_yaml(str(TOY_CONFIG))["applications"][0]["args"])
    args["auth"] = {**args.get("auth", {}), "enabled": False}
    if model_set == "long-writer":
        from specexit_core.teachers.long_writer import LONG_WRITER_DIR, MAX_MODEL_LEN

        args["model"] = {
            **{k: v for k, v in args["model"].items() if k not in ("draft", "num_speculative_tokens")},
            "id": "long-writer",
            "source": str(LONG_WRITER_DIR),
            "max_model_len": MAX_MODEL_LEN,
            "reasoning_parser": None,  # it writes no <think>
        }
    return args


def prompt_ids(model_set: str, tokenizer, n: int, seed: int = 7) -> tuple[list[list[int]], list[Any]]:
    """(token ids the engine gets, what the endpoint is sent) for n fixed test prompts."""
    if model_set == "toy":
        from specexit_core.toy.task import problems

        contents = [p.prompt for p in problems("test", n, seed=seed)]
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
            for c in contents
        ]
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], contents
    from specexit_core.teachers.long_writer_task import prompts

    ids = [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in prompts("test", n, seed=seed)]
    return ids, ids


# -- CPU time by process role ---------------------------------------------------------------------------------
def role_of(title: str, pid: int, me: int, me_role: str) -> str:
    if pid == me:
        return me_role
    return next((role for marker, role in ROLE_MARKERS if marker in title), "ray")


def cpu_snapshot(me_role: str) -> dict[int, tuple[str, float]]:
    """pid -> (role, user + system CPU seconds) of this process and all its descendants."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            title = " ".join(p.cmdline()) or p.name()
            out[p.pid] = (role_of(title, p.pid, me.pid, me_role), t.user + t.system)
        except psutil.Error:
            pass  # gone meanwhile
    return out


def cpu_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role between two snapshots (a process born in between counts whole; one that died
    in between is lost: none do in a timed run)."""
    out: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        prev = before.get(pid)
        out[role] = out.get(role, 0.0) + cpu - (prev[1] if prev and prev[0] == role else 0.0)
    return out


# -- one timed run ----------------------------------------------------------------------------------------------
@dataclass
class Measured:
    path: str  # "direct" | "serve"
    concurrency: int
    wall_s: float
    latencies_s: list[float]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cpu_s: dict[str, float]
    load_average: float | None = None
    extra: dict = field(default_factory=dict)


async def timed(path: str, one, items: list, concurrency: int) -> Measured:
    """`one(item) -> (prompt_tokens, completion_tokens)` for every item, `concurrency` at a time."""
    sem = asyncio.Semaphore(concurrency)
    lat, ptok, ctok = [], [], []

    async def go(item):
        async with sem:
            t = time.perf_counter()
            p, c = await one(item)
            lat.append(time.perf_counter() - t)
            ptok.append(p)
            ctok.append(c)

    me_role = "frontend" if path == "direct" else CLIENT_ROLE
    before = cpu_snapshot(me_role)
    t0 = time.perf_counter()
    await asyncio.gather(*(go(x) for x in items))
    wall = time.perf_counter() - t0
    cpu = cpu_by_role(before, cpu_snapshot(me_role))
    return Measured(path, concurrency, wall, lat, ptok, ctok, cpu, os.getloadavg()[0])


# -- rows (pure: tests/unit/test_serve_bench.py drives it with fakes) -----------------------------------------
def _ms(seconds: float, n: int) -> float:
    return round(1000 * seconds / n, 2)


def row(m: Measured) -> dict:
    n = len(m.latencies_s)
    outside = sum(v for k, v in m.cpu_s.items() if k not in (ENGINE_ROLE, CLIENT_ROLE))
    return {
        "path": m.path,
        "concurrency": m.concurrency,
        "requests": n,
        "prompt_tokens": sum(m.prompt_tokens),
        "completion_tokens": sum(m.completion_tokens),
        "wall_s": round(m.wall_s, 3),
        "requests_per_s": round(n / m.wall_s, 3),
        "tokens_per_s": round(sum(m.completion_tokens) / m.wall_s, 1),
        "p50_latency_s": round(percentile(m.latencies_s, 0.5), 4),
        "p99_latency_s": round(percentile(m.latencies_s, 0.99), 4),
        "mean_latency_s": round(statistics.mean(m.latencies_s), 4),
        "cpu_ms_per_request": {k: _ms(v, n) for k, v in sorted(m.cpu_s.items())},
        "engine_cpu_ms_per_request": _ms(m.cpu_s.get(ENGINE_ROLE, 0.0), n),
        "outside_engine_cpu_ms_per_request": _ms(outside, n),
        "load_average": None if m.load_average is None else round(m.load_average, 2),
        **m.extra,
    }


def _key(m: Measured) -> tuple:
    return m.path, m.extra.get("variant"), m.concurrency


def pool(ms: list[Measured]) -> Measured:
    """One path's runs at one concurrency over the rounds, as one run: requests, wall time and CPU summed."""
    cpu: dict[str, float] = {}
    for m in ms:
        for k, v in m.cpu_s.items():
            cpu[k] = cpu.get(k, 0.0) + v
    loads = [m.load_average for m in ms if m.load_average is not None]
    return Measured(
        ms[0].path,
        ms[0].concurrency,
        sum(m.wall_s for m in ms),
        [x for m in ms for x in m.latencies_s],
        [x for m in ms for x in m.prompt_tokens],
        [x for m in ms for x in m.completion_tokens],
        cpu,
        statistics.mean(loads) if loads else None,
        {k: v for k, v in ms[0].extra.items() if k != "round"},
    )


def build_rows(measured: list[Measured]) -> list[dict]:
    """One row per (path, variant, concurrency), its rounds pooled (`extra["round"]`: the runs alternate
    direct and Serve, so load from other work on the machine falls on both). Every row names the engine
    time per request (the direct row's wall time per request at its concurrency); serve rows add the
    ratio to the direct row (pooled, and per round), the CPU they add per request, and whether both paths
    did the same engine work (equal token counts)."""
    groups: dict[tuple, list[Measured]] = {}
    for m in measured:
        groups.setdefault(_key(m), []).append(m)
    rows = []
    for (path, _, c), ms in groups.items():
        r = row(pool(ms))
        r["rounds"] = len(ms)
        if path != "direct":
            direct_by_round = {m.extra.get("round"): m for m in groups.get(("direct", None, c), [])}
            r["ratio_by_round"] = [
                round((len(m.latencies_s) / m.wall_s) / (len(d.latencies_s) / d.wall_s), 3)
                for m in ms
                if (d := direct_by_round.get(m.extra.get("round"))) is not None
            ]
        rows.append(r)
    direct = {r["concurrency"]: r for r in rows if r["path"] == "direct"}
    for r in rows:
        d = direct.get(r["concurrency"])
        if d is None:
            continue
        r["engine_ms_per_request"] = round(1000 * d["wall_s"] / d["requests"], 1)
        if r["path"] != "direct":
            r["ratio_vs_direct"] = round(r["requests_per_s"] / d["requests_per_s"], 3)
            r["added_cpu_ms_per_request"] = round(
                r["outside_engine_cpu_ms_per_request"] - d["outside_engine_cpu_ms_per_request"], 2
            )
            r["same_engine_work"] = (r["prompt_tokens"], r["completion_tokens"], r["requests"]) == (
                d["prompt_tokens"],
                d["completion_tokens"],
                d["requests"],
            )
    return rows


def summary_line(r: dict) -> str:
    s = (
        f"{r['path']:6s} c={r['concurrency']:<3d} {r['requests']:4d} req  {r['requests_per_s']:7.2f} req/s "
        f"{r['tokens_per_s']:8.1f} tok/s  p50 {1000 * r['p50_latency_s']:7.1f} ms  "
        f"engine {r.get('engine_ms_per_request', float('nan')):7.1f} ms/req  "
        f"outside-engine CPU {r['outside_engine_cpu_ms_per_request']:6.2f} ms/req"
    )
    if r.get("variant"):
        s = f"{s}  [{r['variant']}]"
    if "ratio_vs_direct" in r:
        s += f"  ratio {r['ratio_vs_direct']:.3f}  added CPU {r['added_cpu_ms_per_request']:.2f} ms/req"
    return s
