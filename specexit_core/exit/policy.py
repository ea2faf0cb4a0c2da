"""SpecExit early-exit policy: when to force ``</think>`` (arXiv 2509.24248).

A draft model predicts per generated token a confidence (0..1), a progress (0..1) and
the remaining thinking tokens (>= 0).  At every paragraph break ("split token") inside
``<think>`` their EWMA over the think tokens is compared with thresholds; when all the
selected signals pass, the engine emits ``</think>`` right after that split token.
Pure Python: :class:`ExitTracker` is fed by the engines, :func:`decide` is their oracle.

Determinism contract: the decision depends only on the tokens and their signals, not on
how tokens are grouped into verification rounds or when signals arrive, provided that
``append`` of token ``t`` comes after ``add_signal`` of every index ``< t``.  A speculative
engine may not have a token's own signal yet when it appends it, so a split token's own
signal is never used for its check.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from specexit_core.exit.settings import ExitConfig
from specexit_core.exit.signal_names import SIGNALS
from specexit_core.exit.smoothing import ewma_step
from specexit_core.exit.thresholds import passes


@dataclass(frozen=True)
class ExitDecision:
    index: int  # generated-token index after which </think> is forced
    reason: str  # "signals" or "max_think_tokens" (the engines report "answer_reserve" for the reserve's budget)
    think_tokens: int  # think tokens up to and including `index`
    # EWMA of all three signals over the think tokens before `index`; empty for budget
    # exits, which do not depend on signals (and whose signals may not have arrived).
    smoothed: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ExitCheck:
    """One threshold check: at split token `index`, what the tracker compared with the thresholds."""

    index: int
    think_tokens: int  # think tokens up to and including `index`
    smoothed: dict[str, float]


def prompt_closed_thinking(prompt_ids: Sequence[int], think_start_id: int, think_end_id: int) -> bool:
    """Whether the prompt itself closed thinking: its last think marker is `</think>` (a chat template
    rendered with `enable_thinking: false`, `reasoning_effort: none`, or a prefilled reasoning). What
    such a request generates is answer, never thinking: no exit, no budget and no answer reserve may
    put a `</think>` into it, so the engines do not follow it."""
    for tok in reversed(prompt_ids):
        if tok == think_end_id:
            return True
        if tok == think_start_id:
            return False
    return False


class ExitTracker:
    """Per-request exit state, fed incrementally by an engine.  Signals are folded into
    the EWMA lazily, in token order, once both a token and its signals are known, so
    it does not matter whether signals arrive before or after their token.

    ``on_check`` (optional) sees every threshold check the tracker makes, passing or not:
    calibration's replay records them once and judges any threshold setting from them."""

    def __init__(
        self,
        cfg: ExitConfig,
        *,
        split_token_ids: Iterable[int],
        think_start_id: int,
        think_end_id: int,
        in_think: bool = True,
        on_check: Callable[[ExitCheck], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self._split = frozenset(split_token_ids)
        self._think_start, self._think_end = think_start_id, think_end_id
        self._on_check = on_check
        self._in_think = in_think
        self._think_end_at: int | None = None  # index of </think>: no checks after it
        self._think_tokens = 0
        self._decision: ExitDecision | None = None
        self._n_tokens = 0  # index of the next appended token
        self._n_signals = 0  # index of the next add_signal
        self._pending: dict[int, tuple[float, ...]] = {}  # signals not yet folded in
        self._is_think: deque[bool] = deque()  # per token in [_applied, _n_tokens)
        self._applied = 0  # indices < this are folded into the EWMA
        self._average: list[float] | None = None  # per signal, the EWMA over the think tokens so far

    def fork(self) -> ExitTracker:
        """A cheap independent copy, for hypothetical look-ahead over draft tokens."""
        c = copy.copy(self)
        c._pending = dict(self._pending)
        c._is_think = deque(self._is_think)
        c._average = None if self._average is None else list(self._average)
        return c

    @property
    def think_tokens(self) -> int:
        return self._think_tokens

    @property
    def in_think(self) -> bool:
        return self._in_think

    @property
    def exited(self) -> bool:
        return self._decision is not None

    @property
    def decision(self) -> ExitDecision | None:
        return self._decision

    def smoothed(self) -> dict[str, float]:
        """Current EWMA over the think tokens whose token and signals are both known."""
        self._advance()
        return {} if self._average is None else dict(zip(SIGNALS, self._average))

    def add_signal(self, values: Sequence[float]) -> None:
        """Signals (confidence, progress, remaining) of the next token index."""
        index = self._n_signals
        self._n_signals += 1
        if self._decision is not None or not self.cfg.enabled:
            return  # nothing will ever read them; don't keep them
        vals = tuple(float(v) for v in values)
        if len(vals) != len(SIGNALS) or not all(math.isfinite(v) for v in vals):
            # A NaN would silently poison the EWMA forever: fail loudly instead.
            raise ValueError(f"signals for token {index} must be 3 finite numbers {SIGNALS}, got {values!r}")
        self._pending[index] = vals
        self._advance()

    def append(self, token_id: int) -> ExitDecision | None:
        """The next generated token; returns a decision if ``</think>`` must follow it."""
        self._advance()  # fold in what is known for indices < t before adding t
        t = self._n_tokens
        self._n_tokens += 1
        if self._decision is not None:
            return None
        is_think = False
        if self._think_end_at is not None:
            pass  # after </think>: never thinking again (still recorded, so signals drain)
        elif token_id == self._think_start:
            self._in_think = True
        elif token_id == self._think_end:
            self._in_think, self._think_end_at = False, t
        elif self._in_think:
            is_think = True
            self._think_tokens += 1
        if not self.cfg.enabled:
            return None  # off: count think tokens, but keep no signal state at all
        self._is_think.append(is_think)
        if not is_think:
            return None
        if self.cfg.max_think_tokens is not None and self._think_tokens == self.cfg.max_think_tokens:
            self._decision = ExitDecision(t, "max_think_tokens", self._think_tokens, {})
        elif token_id in self._split and self._think_tokens >= self.cfg.min_think_tokens:
            self._check_signals(t)
        if self._decision is not None:  # frozen from now on: free the buffers
            self._pending.clear()
            self._is_think.clear()
        return self._decision

    def _advance(self) -> None:
        """Fold signals into the EWMA in token order, as far as tokens and signals allow."""
        a = self.cfg.alpha
        while self._is_think and self._applied in self._pending:
            vals = self._pending.pop(self._applied)
            if self._is_think.popleft():  # signals of non-think tokens are not smoothed
                prev = self._average or (None,) * len(vals)
                self._average = [ewma_step(e, x, a) for e, x in zip(prev, vals)]
            self._applied += 1

    def _check_signals(self, t: int) -> None:
        # _advance() ran at the top of append(), so _applied < t means a gap.
        if self._applied < t:
            raise RuntimeError(
                f"exit check at split token {t} needs the signals of all earlier tokens, but those "
                f"of token {self._applied} are missing (contract: add_signal for every index < t "
                f"before append of token t)"
            )
        if self._average is None:
            return  # no think-token signal yet: nothing to judge on
        s = dict(zip(SIGNALS, self._average))
        if self._on_check is not None:
            self._on_check(ExitCheck(t, self._think_tokens, s))
        if passes(s, self.cfg):
            self._decision = ExitDecision(t, "signals", self._think_tokens, s)


def decide(
    token_ids: Sequence[int],
    signals: Sequence[Sequence[float]],
    cfg: ExitConfig,
    *,
    split_token_ids: Iterable[int],
    think_start_id: int,
    think_end_id: int,
    in_think: bool = True,
) -> ExitDecision | None:
    """Reference decision for a whole sequence (``signals[i]`` belongs to ``token_ids[i]``)."""
    if len(signals) != len(token_ids):
        raise ValueError(f"need one signal triple per token: {len(token_ids)} tokens, {len(signals)} signals")
    tracker = ExitTracker(
        cfg,
        split_token_ids=split_token_ids,
        think_start_id=think_start_id,
        think_end_id=think_end_id,
        in_think=in_think,
    )
    for tok, sig in zip(token_ids, signals):
        tracker.add_signal(sig)
        decision = tracker.append(tok)
        if decision is not None:
            return decision
    return None
