"""`specexit toy eval`: accuracy, thinking length and measured overthinking of the toy teacher.

Overthinking is measured by probing the teacher itself, as the SpecExit labels are built: at every
paragraph break of a greedy trace, cut the trace there, force ``</think>``, let the model answer
greedily and grade it. The *oracle exit* of a trace is the earliest break after which every forced
answer (and the natural one) is right; the overthinking ratio is the share of think tokens after it.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from specexit_core.labels import probe_prompts, step_boundaries
from specexit_core.toy.hf_generate import generate, load_teacher
from specexit_core.toy.task import Problem, grade, problems

PROBE_MAX_TOKENS = 8


@dataclass
class ToyEval:
    n: int
    accuracy: float
    accuracy_sampled: float
    mean_think_tokens: float
    think_tokens_std: float
    overthinking_ratio: float
    slip_rate_sampled: float
    mean_think_tokens_sampled: float
    unfinished: int  # greedy traces that never closed </think> within the token limit
    probe_requests: int
    split: str = "test"

    def to_json(self) -> dict:
        return asdict(self)


def prompt_ids(tok, p: Problem) -> list[int]:
    """The prompt token ids of a toy problem in the teacher's chat template (generation prompt on)."""
    text = tok.apply_chat_template([{"role": "user", "content": p.prompt}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def think_length(completion: list[int], close_id: int) -> int | None:
    """Number of think tokens before ``</think>`` (None if it never closed)."""
    return completion.index(close_id) if close_id in completion else None


def oracle_exit(
    prompt: list[int], completion: list[int], gold: int, *, model, tok, close_id: int, break_id: int
) -> tuple[int | None, list[tuple[int, bool]]]:
    """Earliest think position after which forced answers stay right, and every (break, correct) probe."""
    end = think_length(completion, close_id)
    if end is None:
        return None, []
    breaks = step_boundaries(completion, {break_id}, 0, end)
    probes = probe_prompts(prompt, completion, breaks, [close_id, break_id])
    outs = generate(model, tok, probes, max_new_tokens=PROBE_MAX_TOKENS) if probes else []
    flags = [grade(tok.decode(o), gold) for o in outs]
    final_ok = grade(tok.decode(completion), gold)
    results = list(zip(breaks, flags))
    if not final_ok:
        return None, results
    cut = end  # no break qualifies -> only the natural end
    for b, ok in reversed(results):
        if not ok:
            break
        cut = b + 1
    return cut, results


def evaluate(
    model_dir: str | Path, n: int = 200, *, seed: int = 0, max_new_tokens: int = 400, split: str = "test"
) -> ToyEval:
    model, tok = load_teacher(model_dir)
    close_id = tok.convert_tokens_to_ids("</think>")
    break_id = tok.convert_tokens_to_ids("\n\n")
    probs = problems(split, n, seed=seed)  # type: ignore[arg-type]
    prompts = [prompt_ids(tok, p) for p in probs]

    greedy = generate(model, tok, prompts, max_new_tokens=max_new_tokens)
    sampled = generate(model, tok, prompts, max_new_tokens=max_new_tokens, temperature=0.6, seed=seed)
    texts_g = [tok.decode(c) for c in greedy]
    texts_s = [tok.decode(c) for c in sampled]

    lens = [think_length(c, close_id) for c in greedy]
    done = [x for x in lens if x is not None]
    lens_s = [x for x in (think_length(c, close_id) for c in sampled) if x is not None]

    ratios, n_probes = [], 0
    for p, pr, comp, L in zip(probs, prompts, greedy, lens):
        if L is None or L == 0:
            continue
        cut, res = oracle_exit(pr, comp, p.answer, model=model, tok=tok, close_id=close_id, break_id=break_id)
        n_probes += len(res)
        if cut is not None:
            ratios.append((L - cut) / L)

    return ToyEval(
        n=n,
        accuracy=sum(grade(t, p.answer) for t, p in zip(texts_g, probs)) / n,
        accuracy_sampled=sum(grade(t, p.answer) for t, p in zip(texts_s, probs)) / n,
        mean_think_tokens=statistics.mean(done) if done else 0.0,
        think_tokens_std=statistics.pstdev(done) if len(done) > 1 else 0.0,
        overthinking_ratio=statistics.mean(ratios) if ratios else 0.0,
        slip_rate_sampled=sum("Wait" in t.split("</think>")[0] for t in texts_s) / n,
        mean_think_tokens_sampled=statistics.mean(lens_s) if lens_s else 0.0,
        unfinished=len(lens) - len(done),
        probe_requests=n_probes,
        split=split,
    )
