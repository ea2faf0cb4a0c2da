"""Several offline vLLM engines one after another in one process, as a test module or a bench starts
them: with the engine core in a process of its own per engine (vLLM's default) against in the caller's
process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, what `specexit_core.vllm_env.apply_cpu_defaults` sets on CPU).

    python studies/bench_offline_engines.py [--engines 6] [--rounds 2]

Each case is a fresh Python process: import vLLM, then `--engines` toy engines in turn (EAGLE-3 with the
shipped SpecExit draft and plain, alternating), each answering one greedy request and then shut down;
every other EAGLE-3 engine is started while the previous plain one is still up (two live engines in
one process, the shape that needs the plugin's shared parallel-state fix). Reports per case the
process's wall time, its CPU seconds with its children's (the engine-core processes), the RSS after
each shutdown (memory given back), and whether every engine of a kind gave the same tokens. Prints
one JSON document.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time

from specexit_core.vllm_env import MULTIPROCESSING_ENV, in_process_engine_env

LAYOUTS = {"engine core in its own process": False, "in process": True}


def child(n: int) -> dict:
    import psutil

    from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
    from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

    apply_cpu_defaults()
    from vllm import LLM, SamplingParams

    spec = {"method": "eagle3", "model": str(DRAFT_DIR), "num_speculative_tokens": 3}
    sp = SamplingParams(max_tokens=40, temperature=0)
    prompt = [{"prompt_token_ids": [1, 20, 30, 40, 50]}]
    tokens: dict[str, set] = {"eagle3": set(), "plain": set()}
    rss, starts, held = [], [], None
    for i in range(n):
        kind = "plain" if i % 2 else "eagle3"
        t = time.time()
        llm = LLM(**toy_llm_kwargs(str(TEACHER_DIR), **({"speculative_config": spec} if kind == "eagle3" else {})))
        starts.append(round(time.time() - t, 2))
        tokens[kind].add(tuple(llm.generate(prompt, sp, use_tqdm=False)[0].outputs[0].token_ids))
        if held is not None:  # the plain engine kept up while this one started and answered
            held.llm_engine.engine_core.shutdown()
            held = None
        if kind == "plain" and i + 1 < n:
            held = llm  # shut down after the next engine has answered
        else:
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        rss.append(round(psutil.Process().memory_info().rss / 2**30, 2))
    return {
        "engine_start_s": starts,
        "rss_gib_after_each": rss,
        "same_tokens_per_kind": all(len(v) == 1 for v in tokens.values()),
    }


def run_case(in_process: bool, n: int) -> dict:
    env = dict(os.environ, **in_process_engine_env(in_process), HF_HUB_OFFLINE="1")
    t = time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(
        [sys.executable, __file__, "--child", "--engines", str(n)], env=env, capture_output=True, text=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    res = json.loads(p.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        MULTIPROCESSING_ENV: "0" if in_process else "1",
        "wall_s": round(time.time() - t, 1),
        "cpu_s": round(cpu, 1),
        **res,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--engines", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.engines)))
        return
    runs = {name: [] for name in LAYOUTS}
    for _ in range(args.rounds):  # alternating, so a slower spell of the machine hits both
        for name, in_process in LAYOUTS.items():
            runs[name].append(run_case(in_process, args.engines))
            print(name, json.dumps(runs[name][-1]), file=sys.stderr, flush=True)
    print(json.dumps({"engines": args.engines, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
