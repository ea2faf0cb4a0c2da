"""Reasoning traces for toy problems that behave like a real reasoning model's.

A trace is ``<think>`` paragraphs ``</think>`` answer, paragraphs separated by the paragraph break:

1. one paragraph per operation (``12 * 3 = 36``); on hard steps (carries, borrows, big products)
   the teacher sometimes *slips* and a ``Wait , ...`` paragraph corrects it right after;
2. then 0-6 redundant re-verification paragraphs (restating the answer, re-running the chain
   forwards, backwards, spot-checking the hard steps). How many depends on the problem
   (more hard steps and an earlier slip -> more checking), with a little noise, so greedy traces
   vary in length across problems and the exit point is something to learn, not a constant.

Everything after the last calculation is overthinking: a forced answer there is already right.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from specexit_core.toy.task import MAX_VALUE, Problem, apply, is_hard

BREAK = "\n\n"  # the paragraph break: one token, the step-split token of the exit policy
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

INVERSE = {"+": "-", "-": "+", "*": "/"}


@dataclass(frozen=True)
class TraceStyle:
    """Knobs of the synthetic teacher (defaults are the shipped teacher's)."""

    slip_prob_hard: float = 0.22
    slip_prob_easy: float = 0.02
    recheck_noise: float = 0.25  # chance the re-check count is off by one from its mode
    p_no_recheck: float = 0.08  # close </think> right after the last calculation (keeps forced exits in distribution)
    max_rechecks: int = 6


@dataclass
class WrittenTrace:
    """A thinking trace as text: paragraphs inside `<think>`, then the answer (every built-in
    teacher's traces are one)."""

    problem: Problem
    paragraphs: list[str]
    answer_text: str

    @property
    def think_text(self) -> str:
        """Think content between ``<think>\\n`` and ``</think>``: each paragraph ends with a break."""
        return "".join(p + BREAK for p in self.paragraphs)

    @property
    def completion(self) -> str:
        """What the assistant writes after the generation prompt (which already opened ``<think>``)."""
        return self.think_text + THINK_CLOSE + BREAK + self.answer_text


@dataclass
class Trace(WrittenTrace):
    n_slips: int = 0
    n_rechecks: int = 0
    # index of the first paragraph after which the final value is known (last calculation)
    answer_known_after: int = 0
    kinds: list[str] = field(default_factory=list)


def slipped_value(a: int, op: str, b: int, rng: random.Random) -> int:
    c = apply(a, op, b)
    if op == "+" and is_hard(a, op, b):
        cands = [c - 10, c + 1]  # forgot the carry, or off by one
    elif op == "-" and is_hard(a, op, b):
        cands = [c + 10, c - 1]  # forgot the borrow
    elif op == "*":
        cands = [c - a, c + a, c + 1]  # one multiple off
    else:
        cands = [c + 1, c - 1]
    cands = [x for x in cands if 0 <= x <= MAX_VALUE and x != c] or [c + 1 if c < MAX_VALUE else c - 1]
    return rng.choice(cands)


def step_text(a: int, op: str, b: int, c: int) -> str:
    return f"{a} {op} {b} = {c}"


def recheck_count(problem: Problem, n_slips: int, rng: random.Random, style: TraceStyle) -> int:
    """Mode: hard steps + 2 per slip + 2, minus 1 for short chains; noisy by +-1."""
    vals = problem.values()
    hard = sum(is_hard(vals[i], op, b) for i, (op, b) in enumerate(problem.steps))
    mode = hard + 2 * n_slips + 2 - (len(problem.steps) <= 3)
    if rng.random() < style.p_no_recheck:
        return 0
    if rng.random() < style.recheck_noise:
        mode += rng.choice((-1, 1))
    return max(0, min(style.max_rechecks, mode))


def recheck_paragraphs(problem: Problem) -> list[tuple[str, str]]:
    """The ordered menu of re-verification paragraphs; a trace takes a prefix of it."""
    vals, steps = problem.values(), problem.steps
    ans = vals[-1]
    fwd = " , ".join(step_text(vals[i], op, b, vals[i + 1]) for i, (op, b) in enumerate(steps))
    bwd = " , ".join(step_text(vals[i + 1], INVERSE[op], b, vals[i]) for i, (op, b) in reversed(list(enumerate(steps))))
    menu = [
        ("restate", f"So the answer is {ans} ."),
        ("forward", f"Let me check again : {fwd} ."),
        ("backward", f"Check backwards : {bwd} . Yes ."),
    ]
    hard = [i for i, (op, b) in enumerate(steps) if is_hard(vals[i], op, b)]
    for i in hard:
        op, b = steps[i]
        menu.append(("spot", f"Check {vals[i]} {op} {b} again : {step_text(vals[i], op, b, vals[i + 1])} . Yes ."))
    menu += [("forward", f"Let me check again : {fwd} ."), ("restate", f"So the answer is {ans} .")] * 3
    return menu


def make_trace(problem: Problem, rng: random.Random, style: TraceStyle = TraceStyle()) -> Trace:
    vals = problem.values()
    paragraphs: list[str] = []
    kinds: list[str] = []
    n_slips = 0
    for i, (op, b) in enumerate(problem.steps):
        a, c = vals[i], vals[i + 1]
        p_slip = style.slip_prob_hard if is_hard(a, op, b) else style.slip_prob_easy
        if rng.random() < p_slip:
            wrong = slipped_value(a, op, b, rng)
            paragraphs.append(step_text(a, op, b, wrong))
            paragraphs.append(f"Wait , {step_text(a, op, b, c)} , not {wrong} .")
            kinds += ["slip", "correction"]
            n_slips += 1
        else:
            paragraphs.append(step_text(a, op, b, c))
            kinds.append("step")
    known_after = len(paragraphs) - 1
    n = recheck_count(problem, n_slips, rng, style)
    for kind, text in recheck_paragraphs(problem)[:n]:
        paragraphs.append(text)
        kinds.append(kind)
    return Trace(
        problem=problem,
        paragraphs=paragraphs,
        answer_text=f"The answer is {vals[-1]} .",
        n_slips=n_slips,
        n_rechecks=n,
        answer_known_after=known_after,
        kinds=kinds,
    )
