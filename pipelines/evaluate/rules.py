"""Pure decision rules of the evaluated methods and the aggregation helpers (no engine, unit-tested).

- DEER: trial-answer confidence = (arithmetic | geometric) mean of the trial tokens' probabilities,
  optionally skipping the first; exit if it is above the threshold.
- Dynasor-CoT: exit when the last `window` probe answers agree, none is empty and none hedges.
- Oracle: the earliest paragraph break after which every forced answer (and the natural one) is right.
- Budget sweep: the "best" static budget is the fewest think tokens within a tolerance of EAGLE-3.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence


def deer_confidence(logprobs: Sequence[float], *, skip_first: bool = True, mean: str = "arithmetic") -> float:
    """Confidence of a trial answer from its tokens' log-probabilities (0 when nothing is left)."""
    if mean not in ("arithmetic", "geometric"):
        raise ValueError(f"unknown mean {mean!r} (arithmetic | geometric)")
    lps = list(logprobs)[1:] if skip_first else list(logprobs)
    if not lps:
        return 0.0
    if mean == "geometric":
        return math.exp(sum(lps) / len(lps))
    return sum(math.exp(x) for x in lps) / len(lps)


def deer_should_exit(
    logprobs: Sequence[float], *, threshold: float, skip_first: bool = True, mean: str = "arithmetic"
) -> bool:
    return deer_confidence(logprobs, skip_first=skip_first, mean=mean) > threshold


_WORD = re.compile(r"[a-z]+")


def hedges(text: str, hedge_words: Iterable[str]) -> bool:
    """Does the probe answer contain a hedge word (whole words, case-insensitive)?"""
    words = set(_WORD.findall(text.lower()))
    return any(w.lower() in words for w in hedge_words)


def dynasor_should_exit(
    answers: Sequence[str | None], texts: Sequence[str], *, window: int, hedge_words: Iterable[str]
) -> bool:
    """`answers`: extracted probe answers so far (None = no answer); `texts`: the raw probe texts.
    Exit iff the last `window` answers exist, agree, and none of their texts hedges."""
    if len(answers) < window:
        return False
    last = list(answers)[-window:]
    if any(a is None or a == "" for a in last):
        return False
    if len(set(last)) != 1:
        return False
    hw = list(hedge_words)
    return not any(hedges(t, hw) for t in list(texts)[-window:])


def oracle_cut(breaks: Sequence[int], flags: Sequence[bool], final_ok: bool, think_end: int) -> int | None:
    """Think tokens kept by the oracle exit (index after the break), `think_end` if no break
    qualifies, None if the trace's own answer is wrong (no exit can fix it; keep the full trace)."""
    if len(breaks) != len(flags):
        raise ValueError(f"{len(breaks)} breaks but {len(flags)} probe outcomes")
    if not final_ok:
        return None
    cut = think_end
    for b, ok in reversed(list(zip(breaks, flags))):
        if not ok:
            break
        cut = b + 1
    return cut


def count_think_answer(
    completion: Sequence[int], *, think_end_id: int, think_start_id: int, prompt_opened_think: bool
) -> tuple[int, int]:
    """(think tokens, answer tokens) of a completion; `</think>` itself counts as neither."""
    comp = list(completion)
    if prompt_opened_think:
        start = 0
    elif think_start_id in comp:
        start = comp.index(think_start_id) + 1
    else:
        return 0, len(comp)
    if think_end_id in comp[start:]:
        end = comp.index(think_end_id, start)
        return end - start, len(comp) - end - 1
    return len(comp) - start, 0


def best_setting(
    points: Sequence[dict], *, ref_accuracy: float, tolerance: float, cost: str = "think_tokens"
) -> dict | None:
    """The cheapest point (by `cost`, then higher accuracy) with accuracy >= ref - tolerance;
    if none qualifies, the most accurate one. Points are dicts with `accuracy` and `cost`."""
    if not points:
        return None
    ok = [p for p in points if p["accuracy"] >= ref_accuracy - tolerance - 1e-12]
    if ok:
        return min(ok, key=lambda p: (p[cost], -p["accuracy"]))
    return max(points, key=lambda p: (p["accuracy"], -p[cost]))
