"""The long writer's task: one short prompt, then an endless numbered walk whose every line a checker scores.

Prompt (the far references, 11 tokens): ``Walk from S and T by A plus B :`` with S, T in 0..99 and A, B in
1..9. Then line i (13 tokens, so line i starts at output token 13 i):

    Step H L : X + A , Y + B .     H L = i as two numbers (i // 100, i % 100), X = (S + i A) % 100, Y = (T + i B) % 100

Line 0 is written from the prompt's four parameters; every later line follows from the previous line alone
(counter + 1 with a carry, X + A, Y + B, A and B carried over): the walk's state travels in the text, so
coherence at 16K rests on the model doing the same local step at any position, however much text lies
before it (the position handling the build trains), not on looking 16K tokens back. (A first design kept A
and B in the prompt only, so that every line needed a lookup up to 16K back: in a 15-minute build the model
learnt to guess the stride from the previous lines' difference instead and never learnt the lookup, so its
free-running walks were wrong from line 0; docs/longgen.md.) The text repeats the way long text does without
being a copy: 9 of 13 tokens per line are template or carried over (n-grams predict them), the counter never
repeats, X and Y cycle with a period of at most 100 lines. Any line can be written from its index alone
(`line`), which is what lets the build train on short windows placed anywhere in a 16K output (PoSE),
without generating what comes before.

`score` checks a generated output step by step: a step (a complete line) is *correct* when it is exactly the
line the rule makes from the previous generated line and the prompt (line 0: from the prompt), so one
slip counts once; it also reports agreement with the reference walk (every slip after the first counts).
Fractions are given overall and per bucket of the line's first output token (0-1K, 1K-4K, 4K-16K, 16K+).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

MODULUS = 100  # every number is one token (0..99)
MAX_STRIDE = 9
LINE_TOKENS = 13
State = tuple[int, int, int, int, int, int]  # H, L, X, A, Y, B
BUCKETS = ((0, 1024), (1024, 4096), (4096, 16384), (16384, 1 << 40))
Split = Literal["train", "test"]


@dataclass(frozen=True)
class WalkPrompt:
    s: int  # X of line 0
    t: int  # Y of line 0
    a: int  # X's stride, 1..MAX_STRIDE
    b: int  # Y's stride

    @property
    def text(self) -> str:
        return f"Walk from {self.s} and {self.t} by {self.a} plus {self.b} :\n"

    def state(self, i: int) -> State:
        """Line i as numbers (H, L, X, A, Y, B)."""
        return i // 100, i % 100, (self.s + i * self.a) % MODULUS, self.a, (self.t + i * self.b) % MODULUS, self.b

    def line(self, i: int) -> str:
        return render(self.state(i))

    def reference(self, n_lines: int, start: int = 0) -> str:
        return "".join(self.line(i) for i in range(start, start + n_lines))

    @property
    def split(self) -> Split:
        """Deterministic by content: 10% of prompts are test prompts, never trained on."""
        h = int(hashlib.sha1(self.text.encode()).hexdigest()[:8], 16)
        return "test" if h % 10 == 0 else "train"


def next_state(prev: State) -> State:
    """The rule: the line that follows `prev`, from `prev` alone (the local step)."""
    h, lo, x, a, y, b = prev
    return h + (lo == 99), (lo + 1) % 100, (x + a) % MODULUS, a, (y + b) % MODULUS, b


def render(state: State) -> str:
    h, lo, x, a, y, b = state
    return f"Step {h} {lo} : {x} + {a} , {y} + {b} .\n"


def parse(line: str) -> State | None:
    """(H, L, X, A, Y, B) of one line (without its newline), None if it is not a well-formed line."""
    w = line.split(" ")
    if len(w) != 12 or [w[k] for k in (0, 3, 5, 7, 9, 11)] != ["Step", ":", "+", ",", "+", "."]:
        return None
    try:
        nums = tuple(int(w[k]) for k in (1, 2, 4, 6, 8, 10))
    except ValueError:
        return None
    return nums if all(0 <= v < 100 for v in nums) else None  # type: ignore[return-value]


def sample_prompt(rng: random.Random, split: Split | None = None) -> WalkPrompt:
    while True:
        p = WalkPrompt(
            rng.randrange(MODULUS), rng.randrange(MODULUS), rng.randint(1, MAX_STRIDE), rng.randint(1, MAX_STRIDE)
        )
        if split is None or p.split == split:
            return p


def prompts(split: Split, n: int, seed: int = 0) -> list[WalkPrompt]:
    """`n` walk prompts of `split`, the same ones for the same `seed`."""
    rng = random.Random(seed)
    return [sample_prompt(rng, split) for _ in range(n)]


@dataclass
class StepScore:
    index: int  # line number in the output
    token_offset: int  # output token where the line starts
    correct: bool  # follows from the previous generated line by the rule (line 0: from the prompt)
    matches_reference: bool  # equals the reference walk's line


@dataclass
class WalkScore:
    steps: list[StepScore]

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def fraction_correct(self) -> float:
        return sum(s.correct for s in self.steps) / max(1, len(self.steps))

    @property
    def fraction_reference(self) -> float:
        return sum(s.matches_reference for s in self.steps) / max(1, len(self.steps))

    @property
    def first_error(self) -> int | None:
        """Output token offset of the first incorrect step, None if there is none."""
        return next((s.token_offset for s in self.steps if not s.correct), None)

    def buckets(self) -> dict[str, dict]:
        """Per bucket of output position: steps, fraction correct, fraction matching the reference."""
        out = {}
        for lo, hi in BUCKETS:
            st = [s for s in self.steps if lo <= s.token_offset < hi]
            if st:
                out[_bucket_name(lo, hi)] = {
                    "steps": len(st),
                    "correct": sum(s.correct for s in st) / len(st),
                    "reference": sum(s.matches_reference for s in st) / len(st),
                }
        return out

    def to_json(self) -> dict:
        return {
            "steps": self.n_steps,
            "correct": self.fraction_correct,
            "reference": self.fraction_reference,
            "first_error_token": self.first_error,
            "buckets": self.buckets(),
        }


def _bucket_name(lo: int, hi: int) -> str:
    k = lambda v: f"{v // 1024}K" if v else "0"  # noqa: E731
    return f"{k(lo)}+" if hi >= 1 << 40 else f"{k(lo)}-{k(hi)}"


def score(prompt: WalkPrompt, output: str | Sequence[int], tok=None) -> WalkScore:
    """Score an output (text, or token ids with the tokenizer `tok`), complete lines only: a final line
    without its newline (cut by the length limit) is not a step."""
    if tok is None:
        from specexit_core.teachers.long_writer_tokenizer import build_tokenizer

        tok = build_tokenizer()
    ids = tok(output, add_special_tokens=False)["input_ids"] if isinstance(output, str) else list(output)
    nl = tok.convert_tokens_to_ids("\n")
    steps, start, prev = [], 0, None
    for k, t in enumerate(ids):
        if t != nl:
            continue
        i = len(steps)
        got = parse(tok.decode(ids[start:k]))
        # after a malformed line, the reference line is what counts as right (one slip counts once)
        want = prompt.state(0) if i == 0 else next_state(prev) if prev is not None else prompt.state(i)
        steps.append(StepScore(i, start, got is not None and got == want, got == prompt.state(i)))
        prev, start = got, k + 1
    return WalkScore(steps)
