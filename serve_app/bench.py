"""Benchmark: the Serve endpoint vs vLLM's `AsyncLLM` called directly, on the same model, same
engine arguments and same prompts, at concurrency 1 and 16; then SpecExit on vs off through the
endpoint. One run, one JSON (`--json`), ratios included.

    python -m serve_app.bench --json                  # toy teacher + SpecExit draft on CPU
    python -m serve_app.bench --config serve_app/gpu_tp2.yaml --json

The two paths run one after the other (never at once: they would share the cores). Latency is per
request, end to end (non-streaming); throughput is generated tokens per second of wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path


def percentile(xs: list[float], q: float) -> float:
    """The nearest-rank q-quantile (0..1) of xs (also `specexit bench serve`'s)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def _summary(lat: list[float], tokens: list[int], think: list[int], wall: float) -> dict:
    return {
        "requests": len(lat),
        "wall_s": round(wall, 3),
        "tokens": sum(tokens),
        "throughput_tok_s": round(sum(tokens) / wall, 1),
        "requests_per_s": round(len(lat) / wall, 2),
        "p50_latency_s": round(percentile(lat, 0.5), 4),
        "p99_latency_s": round(percentile(lat, 0.99), 4),
        "mean_think_tokens": round(statistics.mean(think), 1) if think else None,
    }


async def _run(one, prompts: list[str], concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    lat, toks, think = [], [], []

    async def go(p):
        async with sem:
            t = time.perf_counter()
            n, th = await one(p)
            lat.append(time.perf_counter() - t)
            toks.append(n)
            if th is not None:
                think.append(th)

    t0 = time.perf_counter()
    await asyncio.gather(*(go(p) for p in prompts))
    return _summary(lat, toks, think, time.perf_counter() - t0)


def _prompts(n: int, seed: int) -> list[str]:
    from specexit_core.toy.task import problems

    return [p.prompt for p in problems("test", n, seed=seed)]


async def bench_direct(engine_kwargs: dict, chat_prompts: list[str], levels: dict, max_tokens: int) -> dict:
    from vllm import SamplingParams

    from serve_app.engine import replica_like_async_llm

    engine = replica_like_async_llm(engine_kwargs)
    try:
        tok = (
            await engine.get_tokenizer()
            if asyncio.iscoroutinefunction(engine.get_tokenizer)
            else engine.get_tokenizer()
        )
        sp = SamplingParams(max_tokens=max_tokens, temperature=0)

        async def one(content: str):
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
            )
            out = None
            async for out in engine.generate(prompt, sp, request_id=uuid.uuid4().hex):  # noqa: B007 (the last one is final)
                pass
            return len(out.outputs[0].token_ids), None

        await _run(one, chat_prompts[:4], 4)  # warm-up
        return {f"c{c}": await _run(one, chat_prompts[:n], c) for c, n in levels.items()}
    finally:
        engine.shutdown()


async def _endpoint_one(client, model: str, content: str, max_tokens: int, xargs: dict | None):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if xargs:
        body["vllm_xargs"] = xargs
    r = await client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    u = r.json()["usage"]
    return u["completion_tokens"], u["specexit"]["think_tokens"]


async def bench_endpoint(url: str, model: str, chat_prompts: list[str], levels: dict, max_tokens: int) -> dict:
    import httpx

    out = {}
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)) as c:
        await _run(lambda p: _endpoint_one(c, model, p, max_tokens, None), chat_prompts[:4], 4)  # warm-up
        for conc, n in levels.items():
            out[f"c{conc}"] = await _run(lambda p: _endpoint_one(c, model, p, max_tokens, None), chat_prompts[:n], conc)
        n16 = levels[max(levels)]
        out["specexit_on"] = out[f"c{max(levels)}"]
        out["specexit_off"] = await _run(
            lambda p: _endpoint_one(c, model, p, max_tokens, {"specexit_enabled": 0}), chat_prompts[:n16], max(levels)
        )
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the benches' Serve endpoints)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(Path(__file__).with_name("toy_cpu.yaml")))
    ap.add_argument("--requests-c1", type=int, default=16)
    ap.add_argument("--requests-c16", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--num-cpus", type=int, default=8, help="logical CPUs for the local Ray instance")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    a = ap.parse_args(argv)

    from serve_app.app import build_app, engine_kwargs
    from serve_app.config import load_args
    from specexit_core.typed_config import read_yaml
    from specexit_core.vllm_env import apply_cpu_defaults, is_cpu_build

    args = load_args(read_yaml(a.config)["applications"][0]["args"])
    if args.model.accelerator == "cpu" and is_cpu_build():
        apply_cpu_defaults(args.model.cpu.kv_cache_gib)
    # the endpoint is measured without auth and without replica scaling noise
    args = args.model_copy(update={"auth": args.auth.model_copy(update={"enabled": False})})
    levels = {1: a.requests_c1, 16: a.requests_c16}
    prompts = _prompts(max(levels.values()), seed=7)
    kw = {"model": args.model.source, "served_model_name": [args.model.id], **engine_kwargs(args)}
    if args.model.accelerator == "cpu":
        kw["distributed_executor_backend"] = "mp"  # what Ray Serve LLM uses on CPU

    direct = asyncio.run(bench_direct(kw, prompts, levels, a.max_tokens))

    import ray
    from ray import serve

    from serve_app.proxy_readiness import patient_proxy_readiness

    port = free_port()
    patient_proxy_readiness()
    ray.init(address="local", num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False)  # its own cluster
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(args), name="bench", route_prefix="/", blocking=False)
        url = f"http://127.0.0.1:{port}"
        import httpx

        t0 = time.time()
        while True:  # ready = a generation succeeds
            try:
                if (
                    httpx.post(
                        url + "/v1/chat/completions",
                        timeout=30,
                        json={
                            "model": args.model.id,
                            "messages": [{"role": "user", "content": "1 + 1"}],
                            "max_tokens": 4,
                        },
                    ).status_code
                    == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            if time.time() - t0 > 600:
                raise TimeoutError("endpoint not ready")
            time.sleep(1)
        endpoint = asyncio.run(bench_endpoint(url, args.model.id, prompts, levels, a.max_tokens))
    finally:
        serve.shutdown()
        ray.shutdown()

    def ratio(x, y):
        return round(x / y, 3) if y else None

    on, off = endpoint["specexit_on"], endpoint["specexit_off"]
    result = {
        "model": args.model.id,
        "draft": args.model.draft,
        "tensor_parallel_size": args.model.tensor_parallel_size,
        "max_tokens": a.max_tokens,
        "direct_asyncllm": direct,
        "endpoint": {k: v for k, v in endpoint.items() if k.startswith("c")},
        "specexit_endpoint": {"on": on, "off": off},
        "ratios": {
            **{
                f"endpoint_vs_direct_throughput_c{c}": ratio(
                    endpoint[f"c{c}"]["throughput_tok_s"], direct[f"c{c}"]["throughput_tok_s"]
                )
                for c in levels
            },
            **{
                f"endpoint_vs_direct_p50_latency_c{c}": ratio(
                    endpoint[f"c{c}"]["p50_latency_s"], direct[f"c{c}"]["p50_latency_s"]
                )
                for c in levels
            },
            **{
                f"endpoint_vs_direct_p99_latency_c{c}": ratio(
                    endpoint[f"c{c}"]["p99_latency_s"], direct[f"c{c}"]["p99_latency_s"]
                )
                for c in levels
            },
            "specexit_on_vs_off_think_tokens": ratio(on["mean_think_tokens"], off["mean_think_tokens"]),
            "specexit_on_vs_off_tokens": ratio(on["tokens"], off["tokens"]),
            "specexit_on_vs_off_wall": ratio(on["wall_s"], off["wall_s"]),
            "specexit_on_vs_off_p50_latency": ratio(on["p50_latency_s"], off["p50_latency_s"]),
            "specexit_on_vs_off_requests_per_s": ratio(on["requests_per_s"], off["requests_per_s"]),
        },
        "serve_overhead_target_met_c16": (
            ratio(endpoint["c16"]["throughput_tok_s"], direct["c16"]["throughput_tok_s"]) or 0
        )
        >= 0.9,
    }
    print(json.dumps(result, indent=None if a.json else 2))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
