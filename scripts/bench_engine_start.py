"""How long a vLLM CPU engine takes to start, with its engine core in a process of its own (vLLM's
default: on CPU the engine core *and* a worker process, each importing torch and vLLM again) and in
the caller's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: vLLM's uniprocess executor).

    python scripts/bench_engine_start.py [--repeats 2] [--bind 0] > docs/results/engine_start_cpu.json

Each case runs in a fresh Python process (the variable must be set before vLLM is imported): import
vLLM, build `LLM(...)` on the toy teacher (float32, eager), then 16 greedy requests of 64 tokens in
one batch and 8 one at a time. Prints one JSON document: seconds per phase and whether the greedy
token ids are the same in both modes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from specexit_core.vllm_env import THREADS_BIND_ENV, in_process_engine_env

MODES = {"engine core in its own processes (default)": {}, "in process": in_process_engine_env()}


def child() -> None:
    t0 = time.time()
    from specexit_core.toy.paths import TEACHER_DIR
    from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

    apply_cpu_defaults()
    from vllm import LLM, SamplingParams

    t1 = time.time()
    llm = LLM(**toy_llm_kwargs(str(TEACHER_DIR)))
    t2 = time.time()
    sp = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    outs = llm.generate([f"Compute {i} + 2 * 3" for i in range(16)], sp, use_tqdm=False)
    t3 = time.time()
    for i in range(8):
        llm.generate([f"Compute {i} * 5"], sp, use_tqdm=False)
    t4 = time.time()
    ids = [list(o.outputs[0].token_ids) for o in outs]
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
    if hasattr(llm.llm_engine.engine_core, "shutdown"):
        llm.llm_engine.engine_core.shutdown()


def run(env: dict) -> dict:
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, __file__, "--child"],
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
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--bind", default=None, help=f"{THREADS_BIND_ENV} for every case (default: every core)")
    a = ap.parse_args()
    if a.child:
        child()
        return
    base = {THREADS_BIND_ENV: a.bind} if a.bind else {}
    runs = {m: [] for m in MODES}
    for _ in range(a.repeats):  # interleaved, so a change of machine load hits both modes
        for m, env in MODES.items():
            runs[m].append(run({**base, **env}))
    keys = ("import_s", "engine_start_s", "batch16_s", "one_at_a_time8_s", "process_wall_s")
    ids = {m: rs[0]["ids"] for m, rs in runs.items()}
    doc = {
        "command": "python scripts/bench_engine_start.py " + " ".join(sys.argv[1:]),
        "bind": a.bind or "every core",
        "median_s": {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in runs.items()},
        "runs_s": {m: [{k: r[k] for k in keys} for r in rs] for m, rs in runs.items()},
        "same_greedy_ids": len({json.dumps(v) for v in ids.values()}) == 1,
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
