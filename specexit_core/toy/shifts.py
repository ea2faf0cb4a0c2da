"""Shifted toy test sets: problems from outside the distribution the teacher and the draft were
trained on (`specexit_core.toy.task`), to ask whether an exit calibrated in distribution still holds.

Each shift changes one thing and is expressible in the toy vocabulary (`toy.tokenizer`: every word
and number 0..99 is one token; anything else would be `<unk>`). Two stay inside the training
support but reweight it (the teacher still solves them; what moves is the trace):

- `longest_seen`: only `MAX_OPS` = 6 operations, the longest chains in training (a fifth of it);
- `hard_steps`: every step a carry, a borrow or a big product (`task.is_hard`): more slips and
  `Wait` corrections;

and four leave it (the toy teacher, 3.2M parameters trained on one distribution, mostly fails them;
they show what the exit does when the model it sits on is lost):

- `longer_chains`: 7-9 operations (training: `MIN_OPS`..`MAX_OPS` = 2-6);
- `large_operands`: `+` / `-` operands 21-99 (training: 1-`MAX_OPERAND` = 20);
- `division`: the `/` operator (exact integer division, in the vocabulary but never in training);
- `phrasing`: the prompt `Compute : ...` instead of `Compute from left to right : ...`.

The same (shift, split, n, seed) always gives the same problems; the split is the content-hash split
of `Problem.split`, as in distribution. The in-distribution generator is untouched: a shift draws
from its own seeded stream.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from specexit_core.toy.task import (
    MAX_OPERAND,
    MAX_OPS,
    MAX_VALUE,
    MIN_OPS,
    OPS,
    Problem,
    Split,
    is_hard,
    random_problem,
)

Shift = Literal["longest_seen", "hard_steps", "longer_chains", "large_operands", "division", "phrasing"]
SHIFTS: tuple[str, ...] = get_args(Shift)

LONGER_OPS = (MAX_OPS + 1, MAX_OPS + 3)  # 7-9 operations: the traces still fit max_model_len 512
LARGE_OPERANDS = (MAX_OPERAND + 1, MAX_VALUE)
PHRASING = "Compute : {text}"  # only words of toy.tokenizer.WORDS


@dataclass(frozen=True)
class ShiftedProblem:
    """A problem of a shifted set and the prompt it is asked with."""

    problem: Problem
    prompt: str

    @property
    def uid(self) -> str:
        return self.problem.uid

    @property
    def answer(self) -> int:
        return self.problem.answer


def _longest_seen(rng: random.Random) -> Problem:
    return random_problem(rng, nops=MAX_OPS)


def _hard_steps(rng: random.Random) -> Problem:
    while True:  # ~1 in 15 training draws qualifies
        p = random_problem(rng)
        if all(is_hard(a, op, b) for a, (op, b) in zip(p.values(), p.steps)):
            return p


def _longer(rng: random.Random) -> Problem:
    return random_problem(rng, nops=rng.randint(*LONGER_OPS))


def _large(rng: random.Random) -> Problem:
    while True:  # at least one +/- step with an operand the teacher never saw
        p = random_problem(rng, nops=rng.randint(MIN_OPS, MAX_OPS), add_sub_operands=LARGE_OPERANDS)
        if any(op in "+-" for op, _ in p.steps):
            return p


def _division(rng: random.Random) -> Problem:
    while True:  # at least one "/" step
        p = random_problem(rng, nops=rng.randint(MIN_OPS, MAX_OPS), ops=(*OPS, "/"))
        if any(op == "/" for op, _ in p.steps):
            return p


_DRAW: dict[str, Callable[[random.Random], Problem]] = {
    "longest_seen": _longest_seen,
    "hard_steps": _hard_steps,
    "longer_chains": _longer,
    "large_operands": _large,
    "division": _division,
    "phrasing": random_problem,  # in-distribution problems, asked another way
}


def prompt_for(shift: str, p: Problem) -> str:
    return PHRASING.format(text=p.text) if shift == "phrasing" else p.prompt


def iter_shifted(shift: str, split: Split, seed: int = 0) -> Iterator[ShiftedProblem]:
    if shift not in _DRAW:
        raise ValueError(f"unknown toy shift {shift!r}; known: {', '.join(SHIFTS)}")
    rng = random.Random(f"specexit-toy-shift-{shift}-{seed}")
    seen: set[str] = set()
    while True:
        p = _DRAW[shift](rng)
        if p.split == split and p.uid not in seen:
            seen.add(p.uid)
            yield ShiftedProblem(p, prompt_for(shift, p))


def shifted_problems(shift: str, split: Split, n: int, seed: int = 0) -> list[ShiftedProblem]:
    """The first `n` distinct problems of `split` in the shifted stream."""
    it = iter_shifted(shift, split, seed)
    return [next(it) for _ in range(n)]
