"""Per-token training labels for the SpecExit draft heads (arXiv 2509.24248).

For every token inside a teacher trace's ``<think>`` segment we derive three signals:

* progress  -- fraction of the thinking done once this token is emitted, in (0, 1];
* remaining -- think tokens still to come after this one (regressed as ``log1p``);
* confidence -- would a forced answer be correct around here, from offline probes.

Probes cut the trace at step boundaries (paragraph-break tokens), close the think
segment, decode a short greedy answer and grade it. Everything here works on plain
token-id lists so it stays independent of the tokenizer and of the inference engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

Shift = Literal["next_step", "same_step"]
_SHIFTS = ("next_step", "same_step")
_ARRAYS = ("confidence", "progress", "remaining", "log_remaining", "mask")


@dataclass
class TraceLabels:
    confidence: np.ndarray  # float32 [n]
    progress: np.ndarray  # float32 [n]
    remaining: np.ndarray  # float32 [n] (tokens)
    log_remaining: np.ndarray  # float32 [n]
    mask: np.ndarray  # bool [n], True inside the think segment
    boundaries: list[int] = field(default_factory=list)
    think_start: int = 0
    think_end: int = 0

    def to_dict(self) -> dict:
        # Plain Python lists/ints so the row goes straight into Parquet or JSON.
        d = {k: getattr(self, k).tolist() for k in _ARRAYS}
        d.update(
            boundaries=[int(b) for b in self.boundaries],
            think_start=int(self.think_start),
            think_end=int(self.think_end),
        )
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TraceLabels:
        arrays = {k: np.asarray(d[k], dtype=bool if k == "mask" else np.float32) for k in _ARRAYS}
        return cls(
            **arrays,
            boundaries=[int(b) for b in d["boundaries"]],
            think_start=int(d["think_start"]),
            think_end=int(d["think_end"]),
        )


def find_think_span(
    completion: Sequence[int], *, think_start_id: int, think_end_id: int, prompt_opened_think: bool = True
) -> tuple[int, int] | None:
    """Return ``(think_start, think_end)`` or None if the trace has no closed think segment.

    ``think_end`` is the index of the ``</think>`` token itself, so the think tokens are
    ``completion[think_start:think_end]``.
    """
    completion = list(completion)
    if prompt_opened_think:
        start = 0  # chat template already emitted <think>; thinking begins at token 0
    else:
        if think_start_id not in completion:
            return None
        start = completion.index(think_start_id) + 1
    try:
        # Search from `start` so a stray </think> before <think> is not taken as the end.
        end = completion.index(think_end_id, start)
    except ValueError:
        return None  # unfinished trace: no ground truth for progress/remaining
    return start, end


def step_boundaries(completion: Sequence[int], split_ids: Iterable[int], think_start: int, think_end: int) -> list[int]:
    """Indices of split tokens inside the think segment (answer-part splits are not steps)."""
    split = set(split_ids)
    return [t for t in range(think_start, think_end) if completion[t] in split]


def _check_span(n: int, think_start: int, think_end: int) -> None:
    if not 0 <= think_start <= think_end <= n:
        raise ValueError(f"bad think span [{think_start}, {think_end}) for a completion of {n} tokens")


def progress_remaining(n: int, think_start: int, think_end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Progress, remaining-token count and mask arrays of length ``n``."""
    _check_span(n, think_start, think_end)
    progress = np.zeros(n, dtype=np.float32)
    remaining = np.zeros(n, dtype=np.float32)
    mask = np.zeros(n, dtype=bool)
    total = think_end - think_start
    if total > 0:
        # done counts the current token, so the last think token has progress 1, remaining 0.
        done = np.arange(1, total + 1, dtype=np.float64)
        progress[think_start:think_end] = done / total
        remaining[think_start:think_end] = total - done
        mask[think_start:think_end] = True
    return progress, remaining, mask


def _check_outcomes(outcomes: Sequence[float], what: str = "outcome") -> list[float]:
    out = []
    for i, o in enumerate(outcomes):
        o = float(o)
        if math.isnan(o) or not 0.0 <= o <= 1.0:
            raise ValueError(f"{what} {i} is {o}; outcomes must lie in [0, 1]")
        out.append(o)
    return out


def confidence_from_probes(
    n: int,
    boundaries: Sequence[int],
    outcomes: Sequence[float],
    think_start: int,
    think_end: int,
    *,
    initial: float = 0.0,
    shift: Shift = "next_step",
) -> np.ndarray:
    """Spread per-boundary probe outcomes over the think tokens as a float32 [n] array.

    "next_step": the probe at b_k (which saw the prefix through b_k) labels the step that
    follows, b_k+1 .. b_{k+1}; tokens up to b_0 get ``initial``. The label of a token is
    then always known from a prefix that ended before it, matching what the draft model
    can have seen.
    "same_step": the probe at b_k labels the step it closes, b_{k-1}+1 .. b_k; tokens after
    the last boundary keep the last outcome. ``initial`` only matters with no boundaries.
    """
    if shift not in _SHIFTS:
        raise ValueError(f"unknown shift {shift!r}; expected one of {_SHIFTS}")
    _check_span(n, think_start, think_end)
    b = [int(x) for x in boundaries]
    if len(outcomes) != len(b):
        raise ValueError(f"got {len(outcomes)} outcomes for {len(b)} boundaries")
    outs = _check_outcomes(outcomes)
    initial = _check_outcomes([initial], "initial")[0]
    if any(not think_start <= x < think_end for x in b):
        raise ValueError(f"boundaries {b} fall outside the think segment [{think_start}, {think_end})")
    if any(x >= y for x, y in zip(b, b[1:])):
        raise ValueError(f"boundaries must be strictly increasing, got {b}")

    conf = np.zeros(n, dtype=np.float32)
    conf[think_start:think_end] = initial
    if shift == "next_step":
        # Step k+1 starts right after b_k and ends at b_{k+1} (or the last think token).
        ends = b[1:] + [think_end - 1]
        for bk, end, o in zip(b, ends, outs):
            conf[bk + 1 : end + 1] = o
    else:
        starts = [think_start] + [x + 1 for x in b[:-1]]
        for s, bk, o in zip(starts, b, outs):
            conf[s : bk + 1] = o
        if b:
            conf[b[-1] + 1 : think_end] = outs[-1]
    return conf


def probe_prompts(
    prompt: Sequence[int], completion: Sequence[int], boundaries: Sequence[int], close_ids: Sequence[int]
) -> list[list[int]]:
    """One forced-answer prompt per boundary: prompt + completion through b + close_ids."""
    prompt, completion, close_ids = list(prompt), list(completion), list(close_ids)
    return [prompt + completion[: b + 1] + close_ids for b in boundaries]


def label_trace(
    prompt: Sequence[int],
    completion: Sequence[int],
    outcomes: Sequence[float],
    *,
    split_ids: Iterable[int],
    think_start_id: int,
    think_end_id: int,
    prompt_opened_think: bool = True,
    initial: float = 0.0,
    shift: Shift = "next_step",
) -> TraceLabels:
    """All labels of one trace, given the probe outcomes at its step boundaries.

    ``prompt`` is unused for the labels themselves (they cover only the completion) but kept
    so the signature mirrors ``label_with_engine``.
    """
    del prompt
    completion = list(completion)
    start, end = _require_span(completion, think_start_id, think_end_id, prompt_opened_think)
    bounds = step_boundaries(completion, split_ids, start, end)
    if len(outcomes) != len(bounds):
        raise ValueError(f"got {len(outcomes)} outcomes for {len(bounds)} step boundaries")
    n = len(completion)
    conf = confidence_from_probes(n, bounds, outcomes, start, end, initial=initial, shift=shift)
    progress, remaining, mask = progress_remaining(n, start, end)
    return TraceLabels(
        confidence=conf,
        progress=progress,
        remaining=remaining,
        log_remaining=np.log1p(remaining).astype(np.float32),
        mask=mask,
        boundaries=bounds,
        think_start=start,
        think_end=end,
    )


def _require_span(completion, think_start_id, think_end_id, prompt_opened_think) -> tuple[int, int]:
    span = find_think_span(
        completion, think_start_id=think_start_id, think_end_id=think_end_id, prompt_opened_think=prompt_opened_think
    )
    if span is None:
        raise ValueError(
            "unfinished trace: no closed think segment (missing </think>"
            + ("" if prompt_opened_think else " or <think>")
            + f"), cannot label {len(completion)} tokens"
        )
    return span


class ProbeEngine(Protocol):
    def generate(self, prompts: list[list[int]], *, max_tokens: int) -> list[list[int]]:
        """Greedy continuations (ids without the prompt), one per prompt, in order."""
        ...


def probe_outcomes(
    engine: ProbeEngine,
    prompt: Sequence[int],
    completion: Sequence[int],
    boundaries: Sequence[int],
    *,
    close_ids: Sequence[int],
    grade: Callable[[list[int]], float],
    max_tokens: int = 16,
) -> list[float]:
    """Probe every boundary of one trace and grade the forced answers.

    All probes go in ONE generate call: they share the prompt + trace prefix, so an engine
    with prefix caching pays for the shared part once. No boundaries -> no call at all.
    """
    prompts = probe_prompts(prompt, completion, boundaries, close_ids)
    if not prompts:
        return []
    answers = engine.generate(prompts, max_tokens=max_tokens)
    if len(answers) != len(prompts):
        raise ValueError(f"engine returned {len(answers)} answers for {len(prompts)} probes")
    return _check_outcomes([grade(list(a)) for a in answers], "graded outcome")


def label_with_engine(
    engine: ProbeEngine,
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    grade: Callable[[list[int]], float],
    split_ids: Iterable[int],
    think_start_id: int,
    think_end_id: int,
    close_ids: Sequence[int],
    max_tokens: int = 16,
    prompt_opened_think: bool = True,
    initial: float = 0.0,
    shift: Shift = "next_step",
) -> TraceLabels:
    """boundaries -> probe_outcomes -> label_trace for one complete trace."""
    if shift not in _SHIFTS:  # fail before spending engine time
        raise ValueError(f"unknown shift {shift!r}; expected one of {_SHIFTS}")
    completion = list(completion)
    split_ids = set(split_ids)
    # Check the trace is finished before probing so unfinished ones cost no generation.
    start, end = _require_span(completion, think_start_id, think_end_id, prompt_opened_think)
    bounds = step_boundaries(completion, split_ids, start, end)
    outs = probe_outcomes(engine, prompt, completion, bounds, close_ids=close_ids, grade=grade, max_tokens=max_tokens)
    return label_trace(
        prompt,
        completion,
        outs,
        split_ids=split_ids,
        think_start_id=think_start_id,
        think_end_id=think_end_id,
        prompt_opened_think=prompt_opened_think,
        initial=initial,
        shift=shift,
    )
