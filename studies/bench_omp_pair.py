"""Two vLLM CPU engines on one small machine: how much their OpenMP threads slow each other.

    python studies/bench_omp_pair.py [--requests 20] > docs/results/omp_pair_cpu.json

Each case starts the toy teacher's engine in a fresh process (alone, then two at once) and times N
requests of 64 tokens sent one at a time, under four thread settings: the default binding (every
core, libgomp's spin), OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=10000, and one core per engine.
Prints one JSON document: seconds of generation per case (docs/cpu-stack.md, "Two engines on two cores").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = {
    "default": [{}, {}],
    "OMP_WAIT_POLICY=PASSIVE": [{"OMP_WAIT_POLICY": "PASSIVE"}] * 2,
    "GOMP_SPINCOUNT=10000": [{"GOMP_SPINCOUNT": "10000"}] * 2,
    "one core each": [{"VLLM_CPU_OMP_THREADS_BIND": "0"}, {"VLLM_CPU_OMP_THREADS_BIND": "1"}],
}


def engine(requests: int) -> None:
    """The child: one engine, `requests` greedy requests of 64 tokens one at a time; prints its time."""
    from specexit_core.toy.paths import TEACHER_DIR
    from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

    apply_cpu_defaults()
    from vllm import LLM, SamplingParams

    llm = LLM(**toy_llm_kwargs(str(TEACHER_DIR)))
    sp = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    t0 = time.time()
    for i in range(requests):
        llm.generate([f"Compute {i} + 2 * 3"], sp, use_tqdm=False)
    print(json.dumps({"generate_s": round(time.time() - t0, 2)}), flush=True)
    llm.llm_engine.engine_core.shutdown()


def run(envs: list[dict], requests: int) -> list[float]:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", "--requests", str(requests)],
            env={**os.environ, "HF_HUB_OFFLINE": "1", **e},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for e in envs
    ]
    outs = [p.communicate()[0] for p in procs]
    return [json.loads([x for x in o.splitlines() if x.startswith('{"generate_s"')][-1])["generate_s"] for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return engine(a.requests)
    res = {"requests": a.requests, "max_tokens": 64, "cpus": os.cpu_count(), "cases": {}}
    for name, envs in CASES.items():
        res["cases"][name] = {"alone_s": run(envs[:1], a.requests)[0], "pair_s": run(envs, a.requests)}
        print(f"{name}: {res['cases'][name]}", file=sys.stderr, flush=True)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
