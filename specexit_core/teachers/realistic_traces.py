"""Reasoning text that is harder to cut than the toy's: the toy's arithmetic chains, written the way
real reasoning models write (issue #13, item 3), for teachers with a real BPE vocabulary.

What differs from `specexit_core.toy.traces`:
- wording varies: several phrasings of a step, of a result, of a re-check ("Wait", "Hmm", "Let me
  double-check", "Alternatively"); a paragraph holds one to three steps; the summary line is
  sometimes missing; punctuation ends most paragraphs, so with byte-level BPE the break merges
  with it (`.\\n\\n`, `:\\n\\n`, `?\\n\\n` are single Qwen3 / Llama-3 tokens);
- a first-pass mistake is sometimes *silent*: a hard step gets a wrong value that carries through
  to a stated (wrong) answer, and only a later re-check catches and fixes it. Exiting right after
  the first stated answer is then wrong, so an exit that comes too early costs accuracy;
- some slips are still caught at once ("Wait, ... not ..."), as in the toy;
- a teacher's style may add a *systematic* silent slip (`trap_slip_prob`): subtracting from a multiple
  of ten, the first pass forgets the borrow, every time. A coin-flip slip is one greedy decoding does
  not reproduce (it takes the majority, the right value); a slip tied to what the step looks like it
  does, so the trained teacher's own first answer is sometimes wrong, not only its training text's.

`trace_stats` measures the two properties the issue asks of such a teacher: the oracle's
overthinking (share of think text after the final answer is first known) and the share of
problems whose first stated answer is wrong.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from specexit_core.toy.task import Problem, apply, is_hard, problems
from specexit_core.toy.traces import BREAK, INVERSE, WrittenTrace, slipped_value

OP_WORDS = {"+": ("plus", "add"), "-": ("minus", "subtract"), "*": ("times", "multiply by")}


# What issue #13 item 3 asks of such a teacher: oracle overthinking within this range, and at least this
# share of problems whose first stated answer is wrong (on the text: trace_stats; by probing a trained
# teacher: studies/probe_teacher.py)
OVERTHINKING_RANGE = (0.40, 0.70)
FIRST_ANSWER_WRONG_MIN = 0.05


@dataclass(frozen=True)
class RealisticStyle:
    """Knobs of the realistic teacher's writing (defaults: r1-llama-like's; each teacher's is its
    `TeacherSpec.build_style`)."""

    silent_slip_prob: float = 0.16  # per problem: one hard step is wrong and caught only by a re-check
    caught_slip_prob: float = 0.12  # per hard step: wrong, then "Wait, ..." at once
    p_summary: float = 0.75  # a "So the answer is N." line after the first pass
    min_rechecks: int = 1
    # Re-checks are uniform in [min, max]. Greedy decoding writes one more whenever stopping is less likely
    # than going on, i.e. until the hazard 1 / (max - k + 1) reaches 1/2: with max 6 greedy traces carried
    # 5-6 re-checks and probed at 0.75-0.80 overthinking (above issue #13's band); with max 3 they carry 2-3
    max_rechecks: int = 3
    p_no_recheck: float = 0.1  # close </think> right after the first pass (or after the fix)
    # per problem with a trap step (`trap_step`: 14% of problems): the first pass forgets its borrow there
    # (`trap_value`) and only a re-check fixes it; 0 draws nothing from the rng (earlier texts unchanged)
    trap_slip_prob: float = 0.0


def trap_step(p: Problem) -> int | None:
    """The first step that subtracts a number not ending in 0 from a multiple of ten (`70 - 13`): where
    a systematic slip (forgetting the borrow) happens."""
    vals = p.values()
    return next((i for i, (op, b) in enumerate(p.steps) if op == "-" and vals[i] % 10 == 0 and b % 10), None)


def trap_value(a: int, b: int) -> int:
    """`a - b` with the borrow forgotten: the units digit right, the tens one too high (70 - 13 = 67)."""
    return a - b + 10


@dataclass
class RealisticTrace(WrittenTrace):
    # the paragraph after which the final (correct) answer is first known: the oracle's exit
    answer_known_after: int = 0
    first_stated_answer: int | None = None  # what the first pass concluded
    kinds: list[str] = field(default_factory=list)

    @property
    def first_answer_wrong(self) -> bool:
        return self.first_stated_answer is not None and self.first_stated_answer != self.problem.answer


def _step(rng: random.Random, a: int, op: str, b: int, c: int) -> str:
    word, verb = OP_WORDS[op]
    return rng.choice(
        (
            f"{a} {op} {b} = {c}",
            f"{a} {word} {b} is {c}",
            f"{verb.capitalize()} {b}: {a} {op} {b} = {c}",
            f"Then {a} {op} {b} gives {c}",
        )
    )


# A paragraph that states a result, in any of `_result`'s wordings (the number is the one group that matched)
STATED_RESULT = re.compile(
    r"answer is (-?\d+)|result is (-?\d+)|gives (-?\d+) as the final value|\*\*Answer: (-?\d+)\*\*"
)


def stated_result(text: str) -> int | None:
    """The number the first result statement in `text` states, or None (studies/probe_teacher.py)."""
    m = STATED_RESULT.search(text)
    return None if m is None else int(next(g for g in m.groups() if g is not None))


def _result(rng: random.Random, ans: int) -> str:
    return rng.choice(
        (
            f"So the answer is {ans}.",
            f"Therefore, the result is {ans}.",
            f"That gives {ans} as the final value.",
            f"**Answer: {ans}**",
        )
    )


def _first_pass(
    rng: random.Random, p: Problem, style: RealisticStyle, silent_at: int | None, trapped: bool = False
) -> tuple[list[str], list[str], list[int]]:
    """Paragraphs of 1-3 steps; the values the writer believes (wrong from `silent_at` on; `trapped`:
    that slip is the trap's forgotten borrow, else a random slip)."""
    believed = [p.start]
    paras, kinds, cur = [], [], []
    for i, (op, b) in enumerate(p.steps):
        a = believed[-1]
        c = apply(a, op, b)
        if i == silent_at:
            c = trap_value(a, b) if trapped else slipped_value(a, op, b, rng)
        elif is_hard(a, op, b) and rng.random() < style.caught_slip_prob:
            wrong = slipped_value(a, op, b, rng)
            paras.append(" ".join([*cur, _step(rng, a, op, b, wrong) + "."]))
            kinds.append("slip")
            cur = []
            paras.append(rng.choice((f"Wait, {a} {op} {b} = {c}, not {wrong}.", f"Hmm, no: {a} {op} {b} is {c}.")))
            kinds.append("correction")
            believed.append(c)
            continue
        believed.append(c)
        text = _step(rng, a, op, b, c)
        cur.append((text if not cur else text[0].lower() + text[1:]) + rng.choice((".", ",", ";")))
        if len(cur) >= rng.randint(1, 3):
            paras.append(" ".join(cur)[:-1] + ".")
            kinds.append("step")
            cur = []
    if cur:
        paras.append(" ".join(cur)[:-1] + ".")
        kinds.append("step")
    return paras, kinds, believed


def _recheck(rng: random.Random, p: Problem, believed: list[int]) -> tuple[str, str, bool]:
    """One re-check paragraph. If the believed chain has a wrong step, this check finds the first
    one and recomputes from there (kind "fix"); else it confirms (kinds vary in wording)."""
    vals = p.values()
    bad = next((i for i in range(len(p.steps)) if believed[i + 1] != vals[i + 1]), None)
    if bad is not None:
        op, b = p.steps[bad]
        rest = ", ".join(f"{vals[j]} {o} {x} = {vals[j + 1]}" for j, (o, x) in enumerate(p.steps) if j > bad)
        fix = rng.choice(("Wait, let me double-check", "Hmm, let me re-check step by step", "Let me verify that"))
        tail = f" Then {rest}." if rest else ""
        text = f"{fix}: {vals[bad]} {op} {b} = {vals[bad + 1]}, not {believed[bad + 1]}.{tail} {_result(rng, vals[-1])}"
        return text, "fix", True
    ans = vals[-1]
    fwd = ", ".join(f"{vals[j]} {o} {x} = {vals[j + 1]}" for j, (o, x) in enumerate(p.steps))
    bwd = ", ".join(f"{vals[j + 1]} {INVERSE[o]} {x} = {vals[j]}" for j, (o, x) in reversed(list(enumerate(p.steps))))
    hard = [j for j, (o, x) in enumerate(p.steps) if is_hard(vals[j], o, x)] or [len(p.steps) - 1]
    j = rng.choice(hard)
    o, x = p.steps[j]
    return (
        rng.choice(
            (
                f"Let me double-check: {fwd}. Yes.",
                f"Alternatively, go backwards: {bwd}. That matches.",
                f"Hmm, is {vals[j]} {o} {x} really {vals[j + 1]}? Yes, it is.",
                f"Quick sanity check of the last step: {vals[-2]} {p.steps[-1][0]} {p.steps[-1][1]} = {ans}.",
                _result(rng, ans),
            )
        ),
        "recheck",
        False,
    )


def make_realistic_trace(p: Problem, rng: random.Random, style: RealisticStyle = RealisticStyle()) -> RealisticTrace:
    vals = p.values()
    hard = [i for i, (op, b) in enumerate(p.steps) if is_hard(vals[i], op, b)]
    trap = trap_step(p) if style.trap_slip_prob > 0 else None
    trapped = trap is not None and rng.random() < style.trap_slip_prob
    if trapped:
        silent_at = trap
    else:
        silent_at = rng.choice(hard) if hard and rng.random() < style.silent_slip_prob else None
    paras, kinds, believed = _first_pass(rng, p, style, silent_at, trapped)
    first = believed[-1]
    if rng.random() < style.p_summary or silent_at is not None:  # a wrong pass always states its answer
        paras.append(_result(rng, first))
        kinds.append("summary")
    known_after = len(paras) - 1 if silent_at is None else None
    n = 0 if rng.random() < style.p_no_recheck else rng.randint(style.min_rechecks, style.max_rechecks)
    n = max(n, 1 if silent_at is not None else 0)  # the silent slip is always caught eventually
    for _ in range(n):
        text, kind, fixed = _recheck(rng, p, believed)
        paras.append(text)
        kinds.append(kind)
        if fixed:
            believed = vals
            known_after = len(paras) - 1
    return RealisticTrace(
        problem=p,
        paragraphs=paras,
        answer_text=rng.choice((f"The answer is {vals[-1]}.", f"**{vals[-1]}**", f"Result: {vals[-1]}")),
        answer_known_after=known_after,
        first_stated_answer=first,
        kinds=kinds,
    )


def trace_stats(n: int = 2000, seed: int = 0, style: RealisticStyle = RealisticStyle()) -> dict:
    """Oracle overthinking (share of think characters after the paragraph where the final answer is
    first known) and the share of problems whose first stated answer is wrong."""
    rng = random.Random(seed)
    over, wrong = [], 0
    for p in problems("train", n, seed=seed):
        t = make_realistic_trace(p, rng, style)
        total = len(t.think_text)
        kept = sum(len(x) + len(BREAK) for x in t.paragraphs[: t.answer_known_after + 1])
        over.append(1 - kept / total)
        wrong += t.first_answer_wrong
    return {"n": n, "oracle_overthinking": sum(over) / n, "first_answer_wrong_share": wrong / n}
