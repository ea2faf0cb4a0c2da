"""`specexit toy demo`: the built-in reasoning model, then SpecExit cutting its overthinking in vLLM.

1. The teacher's own eval (transformers): accuracy, think length, overthinking by probing.
2. vLLM (CPU build) with the SpecExit draft: the same test problems with the exit off (plain
   EAGLE-3 speculative decoding) and on; one example printed with the exit point marked.
(The full pipeline demo -- Ray traces, labels, draft training, serving, evaluation -- replaces this
as the main job once those stages land.)
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time

from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from specexit_core.toy.task import grade, problems
from specexit_core.toy.teacher_eval import evaluate, prompt_ids

log = logging.getLogger("specexit.toy.demo")


def _vllm_compare(n: int) -> tuple[dict, str]:
    from vllm import LLM, SamplingParams

    from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

    apply_cpu_defaults()
    llm = LLM(
        **toy_llm_kwargs(
            str(TEACHER_DIR),
            speculative_config={"method": "eagle3", "model": str(DRAFT_DIR), "num_speculative_tokens": 3},
        )
    )
    tok = llm.get_tokenizer()
    close = tok.convert_tokens_to_ids("</think>")
    probs = problems("test", n, seed=2024)
    prompts = [{"prompt_token_ids": prompt_ids(tok, p)} for p in probs]
    res, outs = {}, {}
    for name, xargs in [("eagle3", {"specexit": False}), ("specexit", None)]:
        t0 = time.perf_counter()
        outs[name] = llm.generate(
            prompts, SamplingParams(max_tokens=400, temperature=0, extra_args=xargs), use_tqdm=False
        )
        wall = time.perf_counter() - t0
        think = [
            list(o.outputs[0].token_ids).index(close) if close in o.outputs[0].token_ids else 400 for o in outs[name]
        ]
        res[name] = {
            "accuracy": sum(grade(o.outputs[0].text, p.answer) for o, p in zip(outs[name], probs)) / n,
            "think_tokens": statistics.mean(think),
            "batch_seconds": round(wall, 2),
        }
    llm.llm_engine.engine_core.shutdown()
    # one example where the exit fired
    example = ""
    for p, a, b in zip(probs, outs["eagle3"], outs["specexit"]):
        ta, tb = a.outputs[0].text, b.outputs[0].text
        if tb != ta:
            cut = tb.split("</think>")[0]
            example = (
                f"=== {p.prompt}   (gold {p.answer})\n<think>\n{cut}>>> SpecExit forced </think> here <<<\n"
                f"{ta[len(cut) :].split('</think>')[0]}</think>{ta.split('</think>')[1]}\n"
                f"--- with the exit:{tb.split('</think>')[1]}"
            )
            break
    return res, example


def run_demo(n: int = 100, json_out: bool = False) -> int:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    log.info("1/2 evaluating the toy teacher on %d held-out problems (greedy, T=0.6, probes) ...", n)
    teacher = evaluate(TEACHER_DIR, n=n).to_json()
    log.info("2/2 vLLM + SpecExit draft on %d test problems, exit off vs on ...", n)
    cmp, example = _vllm_compare(n)
    summary = {
        "teacher": teacher,
        "vllm": cmp,
        "think_token_reduction": 1 - cmp["specexit"]["think_tokens"] / cmp["eagle3"]["think_tokens"],
    }
    if json_out:
        print(json.dumps(summary, indent=2))
        return 0
    print(example)
    print(
        f"\nteacher: accuracy {teacher['accuracy']:.3f} (T=0.6: {teacher['accuracy_sampled']:.3f}), "
        f"{teacher['mean_think_tokens']:.1f} think tokens, overthinking {teacher['overthinking_ratio']:.1%}"
    )
    for name, r in cmp.items():
        print(
            f"vLLM {name:9s} accuracy {r['accuracy']:.3f}  think tokens {r['think_tokens']:6.1f}  "
            f"batch {r['batch_seconds']:.2f}s"
        )
    print(
        f"SpecExit removes {summary['think_token_reduction']:.1%} of the thinking at equal accuracy "
        f"(the oracle exit would remove {teacher['overthinking_ratio']:.1%})."
    )
    return 0
