"""Issue #13 item 3, measured by probing a built-in teacher: how much of its thinking is redundant, and
how often exiting right after the first stated answer would be wrong.

    python studies/probe_teacher.py --teacher qwen3-like [--n 100] [--model FULL] --out out.json

Greedy traces of the teacher (vLLM, in process) on the task's test split; at every paragraph break
inside the thinking, the thinking is closed there (`</think>\\n\\n`, as the evaluation's oracle does)
and the forced answer graded. Both figures use the evaluation's own rules:
* oracle overthinking: 1 - (think tokens up to the oracle's cut) / (think tokens), where the cut is the
  first break from which every probe is right (`pipelines.evaluate.rules.oracle_cut`); problems whose
  own answer is right (the oracle keeps a wrong trace whole). Per problem mean, and token-weighted;
* first stated answer: the first thinking paragraph that states a result ("the answer is N", "the
  result is N", "gives N as the final value", "**Answer: N**": the teachers' wordings,
  `realistic_traces.stated_result`); wrong if the probe right after it is wrong. Also
  reported: the share whose stated number itself is wrong.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from pipelines.common.provenance import emit_result
from pipelines.evaluate.rules import oracle_cut
from specexit_core.exit.split_tokens import split_token_ids
from specexit_core.labels import probe_prompts, step_boundaries
from specexit_core.teachers.materialize import materialize
from specexit_core.teachers.realistic_traces import FIRST_ANSWER_WRONG_MIN, OVERTHINKING_RANGE, stated_result
from specexit_core.teachers.registry import get_teacher
from specexit_core.toy.task import extract_answer, grade, problems

CLOSE_TEXT = "</think>\n\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--model", default=None, help="materialised teacher folder (default: the shipped build)")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=700)
    ap.add_argument("--probe-tokens", type=int, default=10)
    ap.add_argument("--out", default=None, help="also write the JSON here (vLLM logs to stdout in process)")
    a = ap.parse_args()

    from specexit_core.vllm_env import apply_cpu_defaults, in_process_engine_env, toy_llm_kwargs

    os.environ.update(in_process_engine_env())
    apply_cpu_defaults()
    from vllm import LLM, SamplingParams

    spec = get_teacher(a.teacher)
    model = a.model or str(materialize(spec))
    llm = LLM(**toy_llm_kwargs(model, max_model_len=1024, enable_prefix_caching=True))
    tok = llm.get_tokenizer()
    split = split_token_ids(tok)
    close = tok(CLOSE_TEXT, add_special_tokens=False)["input_ids"]
    probs = problems("test", a.n, seed=a.seed)
    prompts = [spec.prompt_ids(tok, p) for p in probs]
    greedy = SamplingParams(max_tokens=a.max_tokens, temperature=0)
    comps = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], greedy)]

    rows, batch = [], []
    for p, prompt, comp in zip(probs, prompts, comps):
        if spec.think_end_id not in comp:
            rows.append({"finished": False})
            continue
        end = comp.index(spec.think_end_id)
        breaks = step_boundaries(comp, split, 0, end)
        rows.append({"finished": True, "end": end, "breaks": breaks, "final_ok": grade(tok.decode(comp), p.answer)})
        batch += [(len(rows) - 1, q) for q in probe_prompts(prompt, comp, breaks, close)]
    sp = SamplingParams(max_tokens=a.probe_tokens, temperature=0)
    outs = llm.generate([{"prompt_token_ids": q} for _, q in batch], sp)
    flags: dict[int, list[bool]] = {}
    for (i, _), o in zip(batch, outs):
        flags.setdefault(i, []).append(extract_answer(o.outputs[0].text) == probs[i].answer)

    over, kept, total, stated, stated_probe_wrong, stated_text_wrong = [], 0, 0, 0, 0, 0
    for i, (r, p, comp) in enumerate(zip(rows, probs, comps)):
        if not r["finished"]:
            continue
        f = flags.get(i, [])
        cut = oracle_cut(r["breaks"], f, r["final_ok"], r["end"])
        if cut is not None and r["end"] > 0:
            over.append(1 - cut / r["end"])
            kept, total = kept + cut, total + r["end"]
        prev = 0
        for k, b in enumerate(r["breaks"]):
            n = stated_result(tok.decode(comp[prev : b + 1]))
            prev = b + 1
            if n is not None:
                stated += 1
                stated_probe_wrong += not f[k]
                stated_text_wrong += n != p.answer
                break
    finished = sum(r["finished"] for r in rows)
    doc = {
        "command": "python studies/probe_teacher.py " + " ".join(sys.argv[1:]),
        "teacher": a.teacher,
        "model": model,
        "n": a.n,
        "finished": finished,
        "accuracy": sum(r.get("final_ok", False) for r in rows) / a.n,
        "probes": len(batch),
        "oracle_overthinking": {
            "problems": len(over),
            "mean_per_problem": statistics.mean(over) if over else None,
            "token_weighted": 1 - kept / total if total else None,
        },
        "first_stated_answer": {
            "problems_stating_one": stated,
            "exit_after_it_wrong_share_of_n": stated_probe_wrong / a.n,
            "exit_after_it_wrong_share_of_stating": stated_probe_wrong / stated if stated else None,
            "stated_number_wrong_share_of_n": stated_text_wrong / a.n,
        },
        "targets": {"oracle_overthinking": list(OVERTHINKING_RANGE), "first_answer_wrong_min": FIRST_ANSWER_WRONG_MIN},
    }
    emit_result(doc, a.out)


if __name__ == "__main__":
    main()
