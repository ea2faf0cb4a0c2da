"""The two paths of `specexit bench serve` (serve_app/serve_bench.py says what is measured and how).

Direct first, then Serve, never at once (they would share the cores); each warmed up before it is timed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from serve_app.proxy_readiness import patient_proxy_readiness
from serve_app.serve_bench import MODEL_SETS, Measured, app_args, build_rows, prompt_ids, summary_line, timed


@dataclass(frozen=True)
class ServeBenchConfig:
    model_set: str = "long-writer"
    concurrency: tuple[int, ...] = (1, 16)
    requests: tuple[int, ...] = (8, 64)  # per concurrency level
    max_tokens: int | None = None  # None: the model set's
    num_cpus: int = 8  # logical CPUs of the local Ray cluster (the toy config asks for 1)
    warmup: int = 4
    rounds: int = 2  # direct then every Serve variant, this many times (engines started afresh each time)
    # Serve path variants: name -> env vars of the local Ray cluster (every Ray process inherits them);
    # e.g. {"default": {}, "throughput": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", ...}}
    serve_variants: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (("default", ()),)

    def resolved_max_tokens(self) -> int:
        return self.max_tokens or MODEL_SETS[self.model_set].max_tokens


def _engine_setup(cfg: ServeBenchConfig):
    from serve_app.app import engine_kwargs
    from serve_app.config import load_args
    from specexit_core.vllm_env import apply_cpu_defaults, is_cpu_build

    args = load_args(app_args(cfg.model_set))
    if args.model.accelerator == "cpu" and is_cpu_build():
        apply_cpu_defaults(args.model.cpu.kv_cache_gib)  # what the replica sets for its engine (server.py)
    kw = {"model": args.model.source, "served_model_name": [args.model.id], **engine_kwargs(args)}
    if args.model.accelerator == "cpu":
        kw["distributed_executor_backend"] = "mp"  # what Ray Serve LLM's replica uses on CPU
    return args, kw


async def run_direct(cfg: ServeBenchConfig, engine_kw: dict) -> tuple[list[Measured], list[list[int]], list]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from serve_app.engine import replica_like_async_llm

    engine = replica_like_async_llm(engine_kw)
    try:
        tok = engine.get_tokenizer()
        ids, sent = prompt_ids(cfg.model_set, tok, max(cfg.requests))
        sp = SamplingParams(
            max_tokens=cfg.resolved_max_tokens(),
            temperature=0,
            ignore_eos=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

        async def one(p: list[int]):
            out = None
            async for out in engine.generate({"prompt_token_ids": p}, sp, request_id=uuid.uuid4().hex):  # noqa: B007
                pass
            return len(out.prompt_token_ids), len(out.outputs[0].token_ids)

        await timed("direct", one, ids[: cfg.warmup], cfg.warmup)
        return [await timed("direct", one, ids[:n], c) for c, n in zip(cfg.concurrency, cfg.requests)], ids, sent
    finally:
        engine.shutdown()


def _one_endpoint(client, model: str, api: str, max_tokens: int):
    extra = {"ignore_eos": True}

    async def one(item):
        if api == "chat":
            r = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": item}],
                max_tokens=max_tokens,
                temperature=0,
                extra_body=extra,
            )
        else:
            r = await client.completions.create(
                model=model, prompt=item, max_tokens=max_tokens, temperature=0, extra_body=extra
            )
        return r.usage.prompt_tokens, r.usage.completion_tokens

    return one


async def _wait_ready(one, item, timeout: float = 300) -> None:
    t0 = time.time()
    while True:  # ready = a generation succeeds (/v1/models is answered before any engine is up)
        try:
            await one(item)
            return
        except Exception:  # noqa: BLE001 -- not up yet (connection refused, 404/503 while deploying)
            if time.time() - t0 > timeout:
                raise
            await asyncio.sleep(1)


async def _endpoint_runs(cfg: ServeBenchConfig, url: str, model: str, sent: list) -> list[Measured]:
    import logging

    import httpx
    from openai import AsyncOpenAI

    # httpx logs every request at INFO (Ray makes the driver's logs JSON): CPU of the client's, on the
    # cores the endpoint needs, that no real client of the endpoint has to spend
    logging.getLogger("httpx").setLevel(logging.WARNING)

    api = MODEL_SETS[cfg.model_set].api
    limits = httpx.Limits(max_connections=max(cfg.concurrency) * 2, max_keepalive_connections=max(cfg.concurrency) * 2)
    async with AsyncOpenAI(
        base_url=url + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=600,
        http_client=httpx.AsyncClient(limits=limits, timeout=600),
    ) as client:
        one = _one_endpoint(client, model, api, cfg.resolved_max_tokens())
        await _wait_ready(one, sent[0])
        await timed("serve", one, sent[: cfg.warmup], cfg.warmup)
        return [await timed("serve", one, sent[:n], c) for c, n in zip(cfg.concurrency, cfg.requests)]


def run_serve(cfg: ServeBenchConfig, args, sent: list, env: dict[str, str] | None = None) -> list[Measured]:
    import os
    import socket

    import ray
    from ray import serve

    from serve_app.app import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})  # before ray.init: the raylet and every worker it starts inherit them
    patient_proxy_readiness()
    # "local": a cluster of this process's own, never one a `ray start` elsewhere on the machine left
    ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(args), name="bench", route_prefix="/", blocking=False)
        return asyncio.run(_endpoint_runs(cfg, f"http://127.0.0.1:{port}", args.model.id, sent))
    finally:
        serve.shutdown()
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(cfg: ServeBenchConfig) -> dict:
    if len(cfg.concurrency) != len(cfg.requests):
        raise ValueError("one request count per concurrency level")
    args, kw = _engine_setup(cfg)
    measured, failed = [], {}
    for rnd in range(cfg.rounds):
        # direct, then each Serve variant: load from other work on the machine falls on every path
        direct, _, sent = asyncio.run(run_direct(cfg, kw))
        for m in direct:
            m.extra["round"] = rnd
        measured += direct
        for name, env in cfg.serve_variants:
            try:
                ms = run_serve(cfg, args, sent, dict(env))
            except Exception as e:  # noqa: BLE001 -- a variant that does not come up is reported, the others stand
                failed[f"{name} (round {rnd})"] = f"{type(e).__name__}: {e}"[:500]
                continue
            for m in ms:
                m.extra.update(variant=name, round=rnd)
            measured += ms
    rows = build_rows(measured)
    setup = {
        "model_set": cfg.model_set,
        "model": args.model.source,
        "draft": args.model.draft,
        "api": MODEL_SETS[cfg.model_set].api,
        "max_tokens": cfg.resolved_max_tokens(),
        "ignore_eos": True,
        "temperature": 0,
        "concurrency": list(cfg.concurrency),
        "rounds": cfg.rounds,
        "requests": list(cfg.requests),
        "engine_kwargs": {k: v for k, v in kw.items() if k != "model"},
        "serve_variants": {name: dict(env) for name, env in cfg.serve_variants},
        "failed_variants": failed,
    }
    return {"setup": setup, "rows": rows}


def main(cfg: ServeBenchConfig, *, as_json: bool = False, extra: dict | None = None, output: str | None = None) -> int:
    res = {**(extra or {}), **run(cfg)}
    for r in res["rows"]:
        print(summary_line(r), flush=True)
    if output:
        from pathlib import Path

        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(res, indent=2) + "\n")
    if as_json:
        print(json.dumps(res))
    ok = all(r.get("same_engine_work", True) for r in res["rows"]) and not res["setup"]["failed_variants"]
    return 0 if ok else 1
