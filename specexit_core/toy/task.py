"""Synthetic multi-step integer arithmetic: problems, splits and the grader.

A problem is a start value and 2-6 operations applied left to right, e.g. ``7 + 5 * 3 - 4``
(= ((7 + 5) * 3) - 4 = 32). Every intermediate value stays in ``0..MAX_VALUE`` so that each number
is one token; operands are ``0..MAX_OPERAND``.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

MAX_VALUE = 99
MAX_OPERAND = 20
MIN_OPS, MAX_OPS = 2, 6
OPS = ("+", "-", "*")

Split = Literal["train", "dev", "test"]


@dataclass(frozen=True)
class Problem:
    start: int
    steps: tuple[tuple[str, int], ...]  # (op, operand) applied left to right

    @property
    def text(self) -> str:
        return " ".join([str(self.start)] + [f"{op} {b}" for op, b in self.steps])

    @property
    def prompt(self) -> str:
        """The user message of the chat."""
        return f"Compute from left to right : {self.text}"

    def values(self) -> list[int]:
        """Intermediate values: [start, after step 1, ..., answer]."""
        vals = [self.start]
        for op, b in self.steps:
            vals.append(apply(vals[-1], op, b))
        return vals

    @property
    def answer(self) -> int:
        return self.values()[-1]

    @property
    def uid(self) -> str:
        return hashlib.sha1(self.text.encode()).hexdigest()[:12]

    @property
    def split(self) -> Split:
        """Deterministic split by content hash: 80% train, 10% dev, 10% test."""
        h = int(self.uid, 16) % 10
        return "test" if h == 0 else "dev" if h == 1 else "train"


def apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a // b
    raise ValueError(f"unknown op {op!r}")


def is_hard(a: int, op: str, b: int) -> bool:
    """A step where people (and our toy teacher) slip: a carry, a borrow, or a big product."""
    if op == "+":
        return (a % 10) + (b % 10) >= 10
    if op == "-":
        return (a % 10) < (b % 10)
    if op == "*":
        return b >= 3 and a * b >= 20
    return False


def random_problem(
    rng: random.Random,
    *,
    nops: int | None = None,
    ops: tuple[str, ...] = OPS,
    add_sub_operands: tuple[int, int] = (1, MAX_OPERAND),
) -> Problem:
    """A random problem. The defaults are the training distribution (their random draws must stay
    as they are: every split and seed depends on them); the keywords are for the shifted test sets
    of `specexit_core.toy.shifts` (a fixed chain length, other operators, other +/- operands)."""
    nops = rng.randint(MIN_OPS, MAX_OPS) if nops is None else nops
    lo_as, hi_as = add_sub_operands
    while True:
        val = rng.randint(0, MAX_OPERAND)
        start, steps = val, []
        for _ in range(nops):
            choices = []
            for op in ops:
                if op == "+":
                    hi = min(hi_as, MAX_VALUE - val)
                    lo = lo_as
                elif op == "-":
                    hi, lo = min(hi_as, val), lo_as
                elif op == "/":  # exact division only, so every value stays an integer token
                    divisors = [b for b in range(2, 10) if val >= b and val % b == 0]
                    hi, lo = (len(divisors) - 1, 0) if divisors else (-1, 0)
                else:  # keep products in range and non-trivial
                    hi = min(9, MAX_VALUE // max(val, 1))
                    lo = 2
                if hi >= lo:
                    choices.append((op, lo, hi))
            if not choices:  # a shifted operator set can run out of moves (e.g. only "/" on a prime)
                break
            op, lo, hi = rng.choice(choices)
            b = rng.randint(lo, hi)
            if op == "/":
                b = divisors[b]
            steps.append((op, b))
            val = apply(val, op, b)
        else:
            return Problem(start, tuple(steps))


def problems(split: Split, n: int, seed: int = 0) -> list[Problem]:
    """The first ``n`` distinct problems of ``split`` drawn from a seeded stream."""
    return list(_take(iter_problems(split, seed), n))


def iter_problems(split: Split, seed: int = 0) -> Iterator[Problem]:
    rng = random.Random(f"specexit-toy-{seed}")
    seen: set[str] = set()
    while True:
        p = random_problem(rng)
        if p.split == split and p.uid not in seen:
            seen.add(p.uid)
            yield p


def _take(it: Iterator[Problem], n: int) -> Iterator[Problem]:
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


_INT = re.compile(r"-?\d+")


def extract_answer(text: str) -> int | None:
    """The final answer in a completion: the last integer after ``</think>`` (or anywhere if none)."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    found = _INT.findall(text)
    return int(found[-1]) if found else None


def grade(text: str, gold: int) -> bool:
    """Whether a completion's final answer (`extract_answer`) is `gold`."""
    return extract_answer(text) == gold


def parse_problem(text: str) -> Problem:
    """Inverse of ``Problem.text`` / ``Problem.prompt`` (used to grade traces from files)."""
    toks = text.split(":")[-1].split()
    start = int(toks[0])
    steps = tuple((toks[i], int(toks[i + 1])) for i in range(1, len(toks), 2))
    return Problem(start, steps)
