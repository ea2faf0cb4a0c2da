"""How long a vLLM CPU engine takes to start, in two process layouts each, for vLLM's two engines:

* `--engine offline` (`LLM`, the pipeline stages): the engine core in processes of its own (vLLM's
  default: on CPU the engine core *and* a worker process, each importing torch and vLLM again) vs in
  the caller's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: vLLM's uniprocess executor; what
  `apply_cpu_defaults` sets since the offline engines run in process);
* `--engine async` (`AsyncLLM`, as a Serve replica starts it): the engine core always has a process
  of its own; with the `mp` backend Ray Serve LLM passes on CPU it spawns a worker process too, with
  `run_model_in_engine_core` (specexit_core/vllm_env.py) it runs the model itself.

    python studies/bench_engine_start.py [--engine offline|async] [--repeats 2] [--bind 0]

Each case runs in a fresh Python process (the variable must be set before vLLM is imported): import
vLLM, build the engine on the toy teacher (float32, eager), then 16 greedy requests of 64 tokens in
one batch and 8 one at a time. Prints one JSON document: seconds per phase and whether the greedy
token ids are the same in both layouts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

from specexit_core.vllm_env import THREADS_BIND_ENV, in_process_engine_env

# layout -> (environment, model in the async engine's engine core)
MODES = {
    "offline": {
        "engine core in its own processes (vLLM's default)": (in_process_engine_env(False), False),
        "in process": (in_process_engine_env(), False),
    },
    "async": {
        "engine core + worker process (Ray Serve LLM's mp backend)": ({}, False),
        "model in the engine core (run_model_in_engine_core)": ({}, True),
    },
}
PROMPTS16 = [f"Compute {i} + 2 * 3" for i in range(16)]
PROMPTS8 = [f"Compute {i} * 5" for i in range(8)]


def _report(t0, t1, t2, t3, t4, ids) -> None:
    print(
        json.dumps(
            {
                "import_s": round(t1 - t0, 2),
                "engine_start_s": round(t2 - t1, 2),
                "batch16_s": round(t3 - t2, 2),
                "one_at_a_time8_s": round(t4 - t3, 2),
                "ids": ids,
            }
        ),
        flush=True,
    )


def child_offline() -> None:
    t0 = time.time()
    from specexit_core.toy.paths import TEACHER_DIR
    from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

    apply_cpu_defaults()
    from vllm import LLM, SamplingParams

    t1 = time.time()
    llm = LLM(**toy_llm_kwargs(str(TEACHER_DIR)))
    t2 = time.time()
    sp = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    outs = llm.generate(PROMPTS16, sp, use_tqdm=False)
    t3 = time.time()
    for p in PROMPTS8:
        llm.generate([p], sp, use_tqdm=False)
    t4 = time.time()
    _report(t0, t1, t2, t3, t4, [list(o.outputs[0].token_ids) for o in outs])
    if hasattr(llm.llm_engine.engine_core, "shutdown"):
        llm.llm_engine.engine_core.shutdown()


async def child_async(model_in_engine_core: bool) -> None:
    t0 = time.time()
    from specexit_core.toy.paths import TEACHER_DIR
    from specexit_core.vllm_env import apply_cpu_defaults, run_model_in_engine_core, toy_llm_kwargs

    apply_cpu_defaults()
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.executor.abstract import Executor

    t1 = time.time()
    cfg = AsyncEngineArgs(**toy_llm_kwargs(str(TEACHER_DIR)), distributed_executor_backend="mp").create_engine_config()
    if model_in_engine_core:
        assert run_model_in_engine_core(cfg)
    engine = AsyncLLM(vllm_config=cfg, executor_class=Executor.get_class(cfg), log_stats=False)
    t2 = time.time()
    sp = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)

    async def one(prompt: str, rid: str) -> list[int]:
        async for out in engine.generate(prompt, sp, request_id=rid):
            last = out
        return list(last.outputs[0].token_ids)

    ids = await asyncio.gather(*(one(p, f"b{i}") for i, p in enumerate(PROMPTS16)))
    t3 = time.time()
    for i, p in enumerate(PROMPTS8):
        await one(p, f"s{i}")
    t4 = time.time()
    _report(t0, t1, t2, t3, t4, ids)
    engine.shutdown()


def run(engine: str, env: dict, model_in_engine_core: bool) -> dict:
    t0 = time.time()
    extra = ["--model-in-engine-core"] if model_in_engine_core else []
    p = subprocess.run(
        [sys.executable, __file__, "--child", "--engine", engine, *extra],
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.time() - t0
    line = [x for x in p.stdout.splitlines() if x.startswith('{"import_s"')]
    if not line:
        raise RuntimeError(p.stderr[-3000:])
    return {**json.loads(line[-1]), "process_wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--engine", choices=sorted(MODES), default="offline")
    ap.add_argument("--model-in-engine-core", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--bind", default=None, help=f"{THREADS_BIND_ENV} for every case (default: every core)")
    a = ap.parse_args()
    if a.child:
        if a.engine == "offline":
            child_offline()
        else:
            asyncio.run(child_async(a.model_in_engine_core))
        return
    base = {THREADS_BIND_ENV: a.bind} if a.bind else {}
    modes = MODES[a.engine]
    runs = {m: [] for m in modes}
    for _ in range(a.repeats):  # interleaved, so a change of machine load hits both modes
        for m, (env, in_core) in modes.items():
            runs[m].append(run(a.engine, {**base, **env}, in_core))
    keys = ("import_s", "engine_start_s", "batch16_s", "one_at_a_time8_s", "process_wall_s")
    ids = {m: rs[0]["ids"] for m, rs in runs.items()}
    doc = {
        "command": "python studies/bench_engine_start.py " + " ".join(sys.argv[1:]),
        "engine": a.engine,
        "bind": a.bind or "every core",
        "median_s": {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in runs.items()},
        "runs_s": {m: [{k: r[k] for k in keys} for r in rs] for m, rs in runs.items()},
        "same_greedy_ids": len({json.dumps(v) for v in ids.values()}) == 1,
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
