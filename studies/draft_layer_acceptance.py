"""Acceptance length of several drafts of one teacher on the same prompts in vLLM.

#41: the qwen3-like loop with a Qwen3-layer draft against the Llama-layer draft trained on the same
labels, steps and seed.

Each draft serves the teacher's test prompts in vLLM (greedy, k speculative tokens, the SpecExit exit
off and no answer reserve, so every think and answer token is drafted: the drafter alone is measured),
one request at a time, reading the engine's speculative-decoding counters before and after each
(`specexit_app.bench.spec_counters`, as `specexit bench vllm` reads them). Acceptance length = 1 +
accepted / drafts (tokens per verifying target step), with a 95% interval resampling prompts. Greedy
decoding is lossless, so both drafts verify the same token sequence: the comparison is paired.

    .venv/bin/python studies/draft_layer_acceptance.py --teacher qwen3-like \\
        --draft llama=DIR_A --draft qwen3=DIR_B --n 40 --out docs/results/draft_formats/draft_layer_acceptance_qwen3_like_cpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pipelines.common.provenance import provenance
from pipelines.evaluate.intervals import paired_ratio_ci95
from specexit_app.bench.spec_counters import acceptance_length, attach
from specexit_core.draft.checkpoint import read_config
from specexit_core.draft.config import LAYER_OPTIONS
from specexit_core.exit import NEVER_FIRES
from specexit_core.teachers.model_ref import resolve_model
from specexit_core.teachers.registry import get_teacher
from specexit_core.toy.task import problems
from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs


def measure(target: str, draft: str, prompts, *, k: int, max_tokens: int, max_len: int) -> dict:
    """Per prompt (drafts, accepted, tokens) on an engine of its own, and the greedy token ids."""
    from vllm import LLM, SamplingParams

    spec_cfg = {"method": "eagle3", "model": draft, "num_speculative_tokens": k}
    llm = LLM(**toy_llm_kwargs(target, max_model_len=max_len, speculative_config=spec_cfg, disable_log_stats=False))
    try:
        counters = attach(llm)
        sp = SamplingParams(
            max_tokens=max_tokens, temperature=0, extra_args={"specexit": {**NEVER_FIRES, "answer_reserve_tokens": 0}}
        )
        llm.generate([{"prompt_token_ids": prompts[0]}], sp, use_tqdm=False)  # warm-up
        rows, t0 = [], time.time()
        for p in prompts:
            before = counters.snapshot()
            out = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
            after = counters.snapshot()
            rows.append(
                {
                    "drafts": after[0] - before[0],
                    "accepted": after[1] - before[1],
                    "ids": list(out.outputs[0].token_ids),
                }
            )
        return {"rows": rows, "seconds": round(time.time() - t0, 1)}
    finally:
        llm.llm_engine.engine_core.shutdown()


def summarise(rows: list[dict]) -> dict:
    """Acceptance length over all prompts, with its 95% interval (prompts resampled)."""
    acc = {i: r["accepted"] for i, r in enumerate(rows)}
    drafts = {i: r["drafts"] for i, r in enumerate(rows)}
    ratio = paired_ratio_ci95(acc, drafts)
    return {
        "acceptance_length": acceptance_length(sum(drafts.values()), sum(acc.values())),
        "ci95": [1 + ratio["ci95"][0], 1 + ratio["ci95"][1]],
        "drafts": sum(drafts.values()),
        "accepted": sum(acc.values()),
        "tokens": sum(len(r["ids"]) for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default="qwen3-like")
    ap.add_argument("--draft", action="append", required=True, help="NAME=DIR (repeat)")
    ap.add_argument("--n", type=int, default=40, help="test problems")
    ap.add_argument("--k", type=int, default=3, help="speculative tokens")
    ap.add_argument("--max-tokens", type=int, default=700)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--made-by", help="how the drafts were made (recorded as `drafts_made_by`)")
    args = ap.parse_args()
    apply_cpu_defaults()
    spec = get_teacher(args.teacher)
    target = resolve_model(f"teacher:{spec.name}")
    tok = spec.load_tokenizer()
    prompts = [spec.prompt_ids(tok, p) for p in problems("test", args.n, seed=0)]
    drafts = dict(d.split("=", 1) for d in args.draft)
    result: dict = {
        "what": __doc__.splitlines()[0],
        "teacher": spec.name,
        "n": args.n,
        "num_speculative_tokens": args.k,
        "max_tokens": args.max_tokens,
        "drafts": {},
        "drafts_made_by": args.made_by,
        "provenance": provenance(),
    }
    ids = {}
    for name, folder in drafts.items():
        m = measure(target, folder, prompts, k=args.k, max_tokens=args.max_tokens, max_len=1024)
        cfg = read_config(folder)
        ids[name] = [r["ids"] for r in m["rows"]]
        result["drafts"][name] = {
            "folder": folder,
            "layer": cfg.layer,
            **{k: getattr(cfg, k) for k in LAYER_OPTIONS},
            **summarise(m["rows"]),
            "seconds": m["seconds"],
        }
    first = next(iter(ids.values()))
    result["same_tokens"] = all(v == first for v in ids.values())  # greedy: lossless, so always true
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(json.dumps({n: [d["acceptance_length"], d["ci95"]] for n, d in result["drafts"].items()}))


if __name__ == "__main__":
    main()
