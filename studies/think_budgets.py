"""Exact think budgets under speculative decoding (#40 item 2), measured with vLLM: many requests with
budgets from 1 to 64 (`specexit_max_think_tokens`, what the endpoint makes of `thinking_token_budget`),
3 to 5 speculative tokens, greedy and sampled, outputs streamed (one delta per engine step, as the
OpenAI server streams) and whole; a response is over budget when it has more think tokens than its
budget (the markers not counted: a `<think>` the model writes itself is not a think token).

Per request it records the think tokens, whether `</think>` came exactly at the budget, and how many
tokens the step that placed `</think>` committed; the summary counts responses over budget (the
target: none), exact placements, and placements inside a step that committed several tokens (drafts
accepted up to the budget, then `</think>`: the hook cut the step there).

    .venv/bin/python studies/think_budgets.py --teacher toy --out docs/results/reasoning_controls/think_budgets_toy_cpu.json
    .venv/bin/python studies/think_budgets.py --teacher qwen3-like --draft runs/demo-qwen3-like-quick/draft \\
        --out docs/results/reasoning_controls/think_budgets_qwen3_like_cpu.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from pipelines.common.provenance import provenance
from serve_app.telemetry import choice_telemetry
from specexit_core.teachers.model_ref import resolve_model
from specexit_core.toy.paths import DRAFT_DIR
from specexit_core.toy.task import problems
from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs


def think_count(ids: list[int], open_id: int, close_id: int) -> tuple[int, bool]:
    """(think tokens as usage counts them, thinking closed): `serve_app.telemetry.choice_telemetry`'s rule."""
    return choice_telemetry(ids, close_id, None, think_start_id=open_id)["think_tokens"], close_id in ids


def run_batch(llm, prompts, budgets, *, temperature: float, stream: bool, seed0: int) -> list[dict]:
    """One batch submitted at once; per request its tokens, step by step when streamed."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    index = {}
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        sp = SamplingParams(
            max_tokens=b + 40,
            temperature=temperature,
            seed=seed0 + i if temperature > 0 else None,
            extra_args={"specexit_max_think_tokens": b},
        )
        sp.output_kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        index[engine.add_request(f"b{seed0}-{i}", {"prompt_token_ids": p}, sp)] = i
        index[f"b{seed0}-{i}"] = i
    tokens: list[list[int]] = [[] for _ in prompts]
    steps: list[list[int]] = [[] for _ in prompts]  # tokens per delta (streamed)
    while engine.has_unfinished_requests():
        for o in engine.step():
            i = index[o.request_id]
            new = list(o.outputs[0].token_ids)
            if stream:
                tokens[i] += new
                steps[i].append(len(new))
            elif o.finished:
                tokens[i] = new
    return [{"tokens": t, "deltas": s} for t, s in zip(tokens, steps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default="toy", help="toy, qwen3-like or r1-llama-like")
    ap.add_argument("--draft", default=str(DRAFT_DIR), help="a SpecExit draft for the teacher")
    ap.add_argument("--requests", type=int, default=48, help="requests per (k, temperature, streaming) cell")
    ap.add_argument("--ks", default="3,4,5", help="speculative tokens per step")
    ap.add_argument("--temperatures", default="0,0.6")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    apply_cpu_defaults()
    from transformers import AutoTokenizer
    from vllm import LLM

    if args.teacher == "toy":
        from specexit_core.toy.paths import TEACHER_DIR
        from specexit_core.toy.teacher_eval import prompt_ids

        target, max_len = str(TEACHER_DIR), 512
        tok = AutoTokenizer.from_pretrained(target)
        prompts = [prompt_ids(tok, p) for p in problems("test", args.requests, seed=77)]
    else:
        from specexit_core.teachers.registry import get_teacher

        spec = get_teacher(args.teacher)
        target, max_len = resolve_model(f"teacher:{spec.name}"), 1024
        tok = spec.load_tokenizer()
        prompts = [spec.prompt_ids(tok, p) for p in problems("test", args.requests, seed=77)]
    open_id, close_id = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    rng = random.Random(5)
    t0 = time.time()
    cells, rows = [], []
    for k in (int(x) for x in args.ks.split(",")):
        spec_cfg = {"method": "eagle3", "model": args.draft, "num_speculative_tokens": k}
        llm = LLM(**toy_llm_kwargs(target, max_model_len=max_len, max_num_seqs=64, speculative_config=spec_cfg))
        for temp in (float(t) for t in args.temperatures.split(",")):
            for stream in (False, True):
                budgets = [rng.randint(1, 64) for _ in prompts]
                outs = run_batch(llm, prompts, budgets, temperature=temp, stream=stream, seed0=len(rows))
                over = exact = natural = close_in_multi = 0
                for b, o in zip(budgets, outs):
                    think, closed = think_count(o["tokens"], open_id, close_id)
                    over += think > b
                    exact += closed and think == b
                    natural += closed and think < b
                    # `</think>` placed at the budget inside a step that committed several tokens
                    if stream and closed and think == b:
                        pos, seen = o["tokens"].index(close_id), 0
                        for n in o["deltas"]:
                            if seen <= pos < seen + n:
                                close_in_multi += n > 1
                                break
                            seen += n
                    rows.append({"k": k, "temperature": temp, "stream": stream, "budget": b, "think": think})
                cells.append(
                    {
                        "k": k,
                        "temperature": temp,
                        "stream": stream,
                        "requests": len(budgets),
                        "over_budget": over,
                        "closed_at_budget": exact,
                        "closed_before_budget": natural,  # a signal exit or the model's own `</think>`
                        "closed_at_budget_in_a_multi_token_step": close_in_multi if stream else None,
                    }
                )
                print(json.dumps(cells[-1]), flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm
    result = {
        "what": "exact think budgets (#40 item 2): responses over budget among requests with budgets 1-64",
        "teacher": args.teacher,
        "draft": args.draft,
        "requests": len(rows),
        "over_budget": sum(c["over_budget"] for c in cells),
        "cells": cells,
        "seconds": round(time.time() - t0, 1),
        **provenance(),
    }
    print(json.dumps({k: result[k] for k in ("teacher", "requests", "over_budget", "seconds")}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
