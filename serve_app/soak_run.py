"""The run of `specexit bench soak` (serve_app/soak.py says what is judged and how).

A local Ray cluster of this process's own with Serve and the toy app (serve_app/toy_cpu.yaml's args,
`replicas` engine replicas, autoscaling min = max, the telemetry folder in a temp dir, removed after), then
`concurrency` clients over HTTP (httpx), each sending one request after the other for the traffic time:
the kinds of serve_app/soak.py in turn. A thread samples the RSS of every process of the cluster (this
process's descendants, roles told apart by process title as in serve_app/serve_bench.py) and the
telemetry folder's size. Requests still running at the end may finish (up to their client timeout).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from serve_app.bench import free_port
from serve_app.proxy_readiness import patient_proxy_readiness
from serve_app.serve_bench import ROLE_MARKERS
from serve_app.soak import (
    ABORT_STREAM,
    ABORT_TIMEOUT,
    APP_NAME,
    CLIENT_ROLE,
    MODEL_ID,
    MemorySamples,
    Result,
    SoakConfig,
    TelemetrySamples,
    app_args,
    check_usage,
    is_5xx,
    request_for,
    summarise,
    summary_lines,
)
from specexit_core.vllm_plugin.telemetry import parse_segment

log = logging.getLogger("specexit.soak")
# the cluster's own processes by the name of their program (argv[0])
PROGRAM_ROLES = {"gcs_server": "gcs", "raylet": "raylet"}
TITLE_ROLES = (
    ("ray::IDLE", "idle_worker"),
    ("DashboardAgent", "dashboard_agent"),
    ("RuntimeEnvAgent", "runtime_env_agent"),
    ("TelemetryAgent", "telemetry_agent"),
    ("log_monitor.py", "log_monitor"),
    ("dashboard/dashboard.py", "dashboard"),
    ("autoscaler/_private/monitor.py", "monitor"),
)


# -- what is sampled ----------------------------------------------------------------------------------------
def role_of(pid: int, me: int, argv: list[str]) -> str:
    if pid == me:
        return CLIENT_ROLE
    title = " ".join(argv)
    for marker, role in ROLE_MARKERS:  # vLLM's engine processes, the Serve actors
        if marker in title:
            return role
    program = os.path.basename(argv[0]) if argv else ""
    if program in PROGRAM_ROLES:
        return PROGRAM_ROLES[program]
    return next((role for marker, role in TITLE_ROLES if marker in title), "ray")


def process_rss() -> dict[int, tuple[str, str, int]]:
    """pid -> (role, title, RSS bytes) of this process and all its descendants."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            argv = p.cmdline() or [p.name()]
            out[p.pid] = (role_of(p.pid, me.pid, argv), " ".join(argv), p.memory_info().rss)
        except psutil.Error:
            pass  # gone meanwhile
    return out


def telemetry_state(root: str) -> tuple[int, int, set, int]:
    """(bytes, files, streams, highest segment number) of the telemetry folder; a stream is one engine
    process's exits, fallbacks or long events in one replica's sub-folder."""
    size = files = top = 0
    streams = set()
    for dirpath, _, names in os.walk(root):
        for n in names:
            try:
                size += os.stat(os.path.join(dirpath, n)).st_size
            except FileNotFoundError:
                continue  # deleted by its replica meanwhile
            files += 1
            seg = parse_segment(n)
            if seg is not None:
                streams.add((os.path.relpath(dirpath, root), seg[0], seg[1]))
                top = max(top, seg[2])
    return size, files, streams, top


class Sampler(threading.Thread):
    def __init__(self, t0: float, interval: float, telemetry_dir: str):
        super().__init__(daemon=True, name="soak-sampler")
        self.t0, self.interval, self.dir = t0, interval, telemetry_dir
        self.mem, self.tel = MemorySamples(), TelemetrySamples()
        self.stop = threading.Event()

    def sample(self) -> None:
        t = time.monotonic() - self.t0
        self.mem.add(t, process_rss())
        self.tel.add(t, *telemetry_state(self.dir))

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.sample()
            except Exception:  # noqa: BLE001 -- a sample lost is reported by the gaps, the run goes on
                log.exception("soak: a sample failed")
            self.stop.wait(self.interval)


# -- the traffic --------------------------------------------------------------------------------------------
async def one(c, i: int, cfg: SoakConfig, prompts: list[str], t0: float) -> Result:
    import httpx

    kind, level, body = request_for(i, cfg, prompts)
    start = time.monotonic()

    def done(status, ok: bool, problem: str | None = None) -> Result:
        return Result(kind, start - t0, time.monotonic() - start, status, ok, level, problem)

    try:
        if body.get("stream"):
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return done(r.status_code, False, r.text[:200])
                usage, finished = None, False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        finished = True
                        break
                    ev = json.loads(line[6:])
                    if isinstance(ev.get("error"), dict) or ev.get("object") == "error":  # an error mid-stream
                        code = (ev.get("error") or ev).get("code")
                        return done(code if isinstance(code, int) else "stream_error", False, line[:200])
                    if kind == ABORT_STREAM:
                        return done(200, True)  # the first chunk: hang up (the engine request is aborted)
                    usage = ev.get("usage") or usage
                if not finished:
                    return done(200, False, "the stream ended without [DONE]")
                problem = check_usage(kind, level, (usage or {}).get("specexit"))
                return done(200, problem is None, problem)
        short = kind == ABORT_TIMEOUT  # the client gives up after abort_timeout_s
        timeout = httpx.Timeout(cfg.request_timeout_s, read=cfg.abort_timeout_s) if short else cfg.request_timeout_s
        r = await c.post("/v1/chat/completions", json=body, timeout=timeout)
        if r.status_code != 200:
            return done(r.status_code, False, r.text[:200])
        problem = check_usage(kind, level, (r.json().get("usage") or {}).get("specexit"))
        return done(200, problem is None, problem)
    except httpx.TimeoutException as e:
        if kind == ABORT_TIMEOUT:
            return done("client_timeout", True)  # the client gave up, as this kind does
        return done(f"error:{type(e).__name__}", False, str(e)[:200])
    except (httpx.HTTPError, ValueError) as e:
        return done(f"error:{type(e).__name__}", False, str(e)[:200])


async def drive(url: str, cfg: SoakConfig, prompts: list[str], t0: float) -> list[Result]:
    """`concurrency` clients, one request after the other each, until the traffic time is over."""
    import httpx

    deadline = t0 + cfg.traffic_s
    results: list[Result] = []
    counter = itertools.count()
    limits = httpx.Limits(max_connections=2 * cfg.concurrency, max_keepalive_connections=2 * cfg.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=cfg.request_timeout_s, limits=limits) as c:

        async def client():
            while time.monotonic() < deadline:
                results.append(await one(c, next(counter), cfg, prompts, t0))

        async def progress():  # a line a minute (or a tenth of a short run): the run is alive and clean
            every = min(60.0, max(cfg.traffic_s / 10, 1.0))
            while time.monotonic() + every < deadline:
                await asyncio.sleep(every)
                print(progress_line(results, time.monotonic() - t0, cfg.traffic_s), file=sys.stderr, flush=True)

        await asyncio.gather(progress(), *(client() for _ in range(cfg.concurrency)))
    return results


def progress_line(results: list[Result], elapsed_s: float, traffic_s: float) -> str:
    """`soak: 3.0 / 20 min, 2510 requests (8.4/s), 0 5xx, 0 failed otherwise`."""
    n = len(results)
    fives = sum(1 for r in results if is_5xx(r.status))
    failed = sum(1 for r in results if not r.ok) - fives
    return (
        f"soak: {elapsed_s / 60:.1f} / {traffic_s / 60:g} min, {n} requests ({n / max(elapsed_s, 1e-9):.1f}/s), "
        f"{fives} 5xx, {failed} failed otherwise"
    )


# -- the cluster --------------------------------------------------------------------------------------------
def _replicas_running() -> int:
    from ray import serve

    app = serve.status().applications.get(APP_NAME)
    dep = app.deployments.get(f"SpecExitLLMServer:{MODEL_ID}") if app else None
    return int((dep.replica_states or {}).get("RUNNING", 0)) if dep else 0


def wait_serving(url: str, replicas: int, timeout: float = 600) -> None:
    """Until the app is RUNNING with all its engine replicas and a chat completion succeeds."""
    import httpx
    from ray import serve

    t0 = time.monotonic()
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Compute from left to right : 1 + 2"}]}
    while time.monotonic() - t0 < timeout:
        app = serve.status().applications.get(APP_NAME)
        if app is not None and app.status in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise RuntimeError(f"the soak app failed to deploy: {app.message}")
        if app is not None and app.status == "RUNNING" and _replicas_running() >= replicas:
            try:
                if httpx.post(url + "/v1/chat/completions", json={**body, "max_tokens": 20}, timeout=60).is_success:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(1)
    raise TimeoutError(f"the soak app was not serving with {replicas} replicas after {timeout:.0f} s")


def run(cfg: SoakConfig) -> dict:
    import ray
    from ray import serve

    from serve_app.app import build_app
    from specexit_core.toy.task import problems

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a log line per request otherwise
    prompts = [p.prompt for p in problems("test", 200, seed=cfg.seed)]
    tdir = tempfile.mkdtemp(prefix="specexit-soak-telemetry-")
    args = app_args(cfg, tdir)
    port = free_port()
    patient_proxy_readiness()
    t_start = time.monotonic()
    # "local": a cluster of this process's own, never one a `ray start` elsewhere on the machine left
    ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(args), name=APP_NAME, route_prefix="/", blocking=False)
        url = f"http://127.0.0.1:{port}"
        wait_serving(url, cfg.replicas)
        start_s = time.monotonic() - t_start
        print(f"soak: serving with {cfg.replicas} replicas after {start_s:.0f} s; traffic for {cfg.minutes:g} min")
        t0 = time.monotonic()
        sampler = Sampler(t0, cfg.sampling_s(), tdir)
        sampler.start()
        results = asyncio.run(drive(url, cfg, prompts, t0))
        sampler.stop.set()
        sampler.join()
        sampler.sample()  # after the last request
        replicas_at_end = _replicas_running()
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(tdir, ignore_errors=True)
    res = summarise(cfg, results, sampler.mem, sampler.tel, cfg.traffic_s)
    res["setup"] = {
        "model": args["model"]["source"],
        "draft": args["model"]["draft"],
        "replicas": cfg.replicas,
        "replicas_running_at_end": replicas_at_end,
        "concurrency": cfg.concurrency,
        "kinds": list(cfg.kinds),
        "max_tokens": cfg.max_tokens,
        "long_tokens": cfg.long_tokens,
        "abort_timeout_s": cfg.abort_timeout_s,
        "request_timeout_s": cfg.request_timeout_s,
        "sample_s": cfg.sampling_s(),
        "telemetry_segment_bytes": cfg.telemetry_segment_bytes,
        "num_cpus": cfg.num_cpus,
        "start_s": round(start_s, 1),
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    return res


def main(cfg: SoakConfig, *, as_json: bool = False, extra: dict | None = None, output: str | None = None) -> int:
    res = run(cfg)
    head = {k: res[k] for k in ("pass", "memory_growth", "p99_ratio", "errors_5xx", "requests", "minutes")}
    res = {**head, **(extra or {}), **res}  # the keys first
    for line in summary_lines(res):
        print(line, flush=True)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(res, indent=2) + "\n")
    if as_json:
        print(json.dumps(res), flush=True)
    return 1 if res["pass"] is False else 0
