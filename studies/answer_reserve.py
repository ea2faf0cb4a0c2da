"""Never an empty answer (#40 item 3), measured on the toy with vLLM: `max_tokens` set to a share
(default 60%) of EAGLE-3's mean completion length, then how often each method returns empty content
(thinking never closed, or nothing after `</think>`) and how accurate the content is.

Methods, on the same problems and seeds, one engine (the toy teacher + a SpecExit draft):
  eagle3_full      SpecExit off, max_tokens 400: the reference length and accuracy
  eagle3           SpecExit off at the limit: what a stock engine returns
  specexit         the draft's exit (its `exit_defaults`) at the limit, with the answer reserve
  specexit_max     effort `max` (the signals never fire) at the limit: the reserve alone

A completion counts as correct only by its content (the text after `</think>`): an answer left inside
thinking is not one the client sees. Accuracy intervals resample problems (pipelines/evaluate/intervals.py).

    .venv/bin/python studies/answer_reserve.py --n 250 --out docs/results/reasoning_controls/answer_reserve_toy_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from pipelines.common.provenance import provenance
from pipelines.evaluate.intervals import accuracy_ci95, paired_diff_ci95
from specexit_app.bench.vllm_bench import engine_kwargs
from specexit_core.exit import NEVER_FIRES
from specexit_core.toy.paths import DRAFT_DIR
from specexit_core.toy.task import grade, problems
from specexit_core.toy.teacher_eval import prompt_ids
from specexit_core.vllm_env import apply_cpu_defaults

FULL_TOKENS = 400  # the toy evaluation's max_tokens


def content_of(ids: list[int], close: int, eos: int, tok) -> str:
    """What a client sees as content: the text after `</think>` ("" when thinking never closed)."""
    ids = [t for t in ids if t != eos]
    return tok.decode(ids[ids.index(close) + 1 :]).strip() if close in ids else ""


def run_method(llm, prompts, golds, tok, *, temperature, max_tokens, extra, seed0=1000) -> dict:
    """Per problem: content empty?, content correct?, think tokens, finish reason."""
    from vllm import SamplingParams

    close, eos = tok.convert_tokens_to_ids("</think>"), tok.eos_token_id
    sps = [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed0 + i if temperature > 0 else None,
            extra_args=None if extra is None else {"specexit": extra},
        )
        for i in range(len(prompts))
    ]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sps, use_tqdm=False)
    rows = []
    for o, gold in zip(outs, golds):
        ids = list(o.outputs[0].token_ids)
        content = content_of(ids, close, eos, tok)
        rows.append(
            {
                "tokens": len(ids),
                "think": ids.index(close) if close in ids else len(ids),
                "empty": content == "",
                "correct": bool(content) and grade("</think>" + content, gold),
                "finish": o.outputs[0].finish_reason,
            }
        )
    return rows


def paired_points(rows: list[dict], base: list[dict]) -> dict:
    """Accuracy of `rows` minus that of `base` on the same problems, in points, with its interval."""
    d = paired_diff_ci95({i: r["correct"] for i, r in enumerate(rows)}, {i: r["correct"] for i, r in enumerate(base)})
    return {"points": round(d["points"], 2), "ci95": [round(x, 2) for x in d["ci95"]]}


def summary(rows: list[dict], base: list[dict] | None = None, limit_base: list[dict] | None = None) -> dict:
    """Shares in percent, means, the accuracy interval, and the paired differences against `base`
    (EAGLE-3 unlimited) and `limit_base` (EAGLE-3 at the same limit)."""
    n = len(rows)
    out = {
        "n": n,
        "empty_percent": round(100 * sum(r["empty"] for r in rows) / n, 2),
        "accuracy": round(sum(r["correct"] for r in rows) / n, 4),
        "accuracy_ci95": [round(x, 4) for x in accuracy_ci95([r["correct"] for r in rows])],
        "completion_tokens": round(statistics.mean(r["tokens"] for r in rows), 2),
        "think_tokens": round(statistics.mean(r["think"] for r in rows), 2),
        "finish_length_percent": round(100 * sum(r["finish"] == "length" for r in rows) / n, 2),
    }
    if base is not None:
        out["vs_eagle3_full_points"] = paired_points(rows, base)
    if limit_base is not None and limit_base is not rows:
        out["vs_eagle3_at_limit_points"] = paired_points(rows, limit_base)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=250, help="test problems")
    ap.add_argument("--share", type=float, default=0.6, help="max_tokens as a share of EAGLE-3's mean length")
    ap.add_argument("--temperatures", default="0,0.6")
    ap.add_argument("--draft", default=str(DRAFT_DIR), help="a SpecExit draft (default: the shipped toy draft)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    apply_cpu_defaults()
    from transformers import AutoTokenizer
    from vllm import LLM

    t0 = time.time()
    llm = LLM(**engine_kwargs(Path(args.draft), 3))
    tok = AutoTokenizer.from_pretrained(llm.llm_engine.model_config.model)
    probs = problems("test", args.n, seed=31)
    prompts, golds = [prompt_ids(tok, p) for p in probs], [p.answer for p in probs]
    result: dict = {
        "what": "answer reserve (#40 item 3): empty content and accuracy at max_tokens = share x EAGLE-3's mean length",
        "draft": args.draft,
        "problems": args.n,
        "share": args.share,
        "by_temperature": {},
    }
    for temp in (float(t) for t in args.temperatures.split(",")):
        full = run_method(llm, prompts, golds, tok, temperature=temp, max_tokens=FULL_TOKENS, extra=False)
        limit = round(args.share * statistics.mean(r["tokens"] for r in full))
        runs = {
            "eagle3": run_method(llm, prompts, golds, tok, temperature=temp, max_tokens=limit, extra=False),
            "specexit": run_method(llm, prompts, golds, tok, temperature=temp, max_tokens=limit, extra=None),
            "specexit_max": run_method(
                llm, prompts, golds, tok, temperature=temp, max_tokens=limit, extra=dict(NEVER_FIRES)
            ),
        }
        result["by_temperature"][str(temp)] = {
            "max_tokens": limit,
            "methods": {
                "eagle3_full": summary(full),
                **{m: summary(r, full, runs["eagle3"]) for m, r in runs.items()},
            },
        }
        print(json.dumps({str(temp): result["by_temperature"][str(temp)]}, indent=1), flush=True)
    result["seconds"] = round(time.time() - t0, 1)
    result.update(provenance())
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
