"""`specexit toy demo`: the toy teacher thinking, in transformers and in vLLM, then its eval.

(The full SpecExit demo -- traces, labels, draft training, serving, evaluation -- replaces this as
the main job once those stages exist.)
"""

from __future__ import annotations

import json
import logging

from .evaluate import evaluate, prompt_ids
from .hf_generate import generate, load_teacher
from .paths import TEACHER_DIR
from .task import grade, problems
from .vllm_generate import make_llm, vllm_generate

log = logging.getLogger("specexit.toy.demo")


def run_demo(n: int = 100, json_out: bool = False) -> int:
    model, tok = load_teacher(TEACHER_DIR)
    shown = problems("test", 3, seed=123)
    prompts = [prompt_ids(tok, p) for p in shown]
    hf = generate(model, tok, prompts, max_new_tokens=400)
    for p, c in zip(shown, hf):
        print(f"\n=== {p.prompt}   (gold {p.answer})\n<think>\n{tok.decode(c)}")
        print(f"--- correct: {grade(tok.decode(c), p.answer)}")

    log.info("starting vLLM (CPU build, float32) on the toy teacher ...")
    llm = make_llm(TEACHER_DIR)
    vl = vllm_generate(llm, prompts, max_tokens=400)
    same = sum(a == b for a, b in zip(hf, vl))
    print(f"\nvLLM greedy == transformers greedy on {same}/{len(shown)} prompts")
    del llm

    log.info("evaluating the teacher on %d held-out problems (greedy, T=0.6, probes) ...", n)
    res = evaluate(TEACHER_DIR, n=n)
    if json_out:
        print(json.dumps(res.to_json(), indent=2))
    else:
        for k, v in res.to_json().items():
            print(f"{k:28s} {v:.4f}" if isinstance(v, float) else f"{k:28s} {v}")
    return 0 if same == len(shown) else 1
