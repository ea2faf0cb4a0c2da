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
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, Sequence

SIGNALS = ("confidence", "progress", "remaining")
# Names accepted in ``ExitConfig.method``; "remain" is the paper's spelling.
_METHOD_NAMES = {**{s: s for s in SIGNALS}, "remain": "remaining"}
_METHOD_HELP = "confidence, progress, remain (alias: remaining)"


def _parse_method(method: str) -> tuple[str, ...]:
    """'progress_confidence' -> ('confidence', 'progress') (canonical order)."""
    if not isinstance(method, str) or not method:
        raise ValueError(f"method must be a non-empty string of signal names joined by '_' "
                         f"(allowed: {_METHOD_HELP}), got {method!r}")
    picked: set[str] = set()
    for part in method.split("_"):
        if part not in _METHOD_NAMES:
            raise ValueError(f"method {method!r}: unknown signal {part!r} (allowed: {_METHOD_HELP})")
        if _METHOD_NAMES[part] in picked:
            raise ValueError(f"method {method!r}: signal {part!r} is listed twice")
        picked.add(_METHOD_NAMES[part])
    return tuple(s for s in SIGNALS if s in picked)


def _typed(name: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    # bool is an int subclass, but `true` as a threshold or count is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class ExitConfig:
    """Early-exit settings; defaults are the paper's.  ``enabled=False`` turns off
    everything, the ``max_think_tokens`` budget included, so "off" means plain decoding."""
    enabled: bool = True
    method: str = "confidence_progress_remain"
    confidence_threshold: float = 0.8   # exit needs smoothed confidence > this
    progress_threshold: float = 0.3     # ... and smoothed progress > this
    remaining_threshold: float = 200.0  # ... and smoothed remaining < this
    alpha: float = 0.1                  # EWMA weight of the newest value
    min_think_tokens: int = 0           # no signal exit before this many think tokens
    max_think_tokens: int | None = None  # hard budget: exit right after this many

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled must be true or false, got {self.enabled!r}")
        _parse_method(self.method)
        # ints -> float (frozen, hence object.__setattr__) so to_dict() round-trips equal
        for name in ("confidence_threshold", "progress_threshold", "remaining_threshold", "alpha"):
            object.__setattr__(self, name, float(_typed(name, getattr(self, name), (int, float))))
        for name in ("confidence_threshold", "progress_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:  # also rejects NaN
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not self.remaining_threshold > 0.0:
            raise ValueError(f"remaining_threshold must be > 0, got {self.remaining_threshold}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if _typed("min_think_tokens", self.min_think_tokens, int) < 0:
            raise ValueError(f"min_think_tokens must be >= 0, got {self.min_think_tokens}")
        if self.max_think_tokens is not None:
            if _typed("max_think_tokens", self.max_think_tokens, int) < 1:
                raise ValueError(f"max_think_tokens must be >= 1 or null, got {self.max_think_tokens}")
            if self.max_think_tokens < self.min_think_tokens:
                raise ValueError(f"max_think_tokens ({self.max_think_tokens}) must be >= "
                                 f"min_think_tokens ({self.min_think_tokens})")

    @property
    def signals_used(self) -> tuple[str, ...]:
        return _parse_method(self.method)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExitConfig":
        return cls().with_overrides(d)

    def with_overrides(self, d: Mapping[str, Any] | None) -> "ExitConfig":
        """A copy with the keys of ``d`` replaced (per-request overrides from HTTP)."""
        if d is None:
            return self
        if not isinstance(d, Mapping):
            raise ValueError(f"exit config overrides must be an object, got {type(d).__name__}")
        known = [f.name for f in fields(self)]
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise ValueError(f"unknown exit config key(s): {', '.join(unknown)} "
                             f"(known keys: {', '.join(known)})")
        return replace(self, **dict(d))  # replace() re-runs __post_init__

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExitDecision:
    index: int         # generated-token index after which </think> is forced
    reason: str        # "signals" or "max_think_tokens"
    think_tokens: int  # think tokens up to and including `index`
    # EWMA of all three signals over the think tokens before `index`; empty for budget
    # exits, which do not depend on signals (and whose signals may not have arrived).
    smoothed: dict[str, float] = field(default_factory=dict)


class ExitTracker:
    """Per-request exit state, fed incrementally by an engine.  Signals are folded into
    the EWMA lazily, in token order, once both a token and its signals are known, so
    it does not matter whether signals arrive before or after their token."""

    def __init__(self, cfg: ExitConfig, *, split_token_ids: Iterable[int], think_start_id: int,
                 think_end_id: int, in_think: bool = True) -> None:
        self.cfg = cfg
        self._split = frozenset(split_token_ids)
        self._think_start, self._think_end = think_start_id, think_end_id
        self._signals_used = cfg.signals_used
        self._in_think = in_think
        self._think_end_at: int | None = None  # index of </think>: no checks after it
        self._think_tokens = 0
        self._decision: ExitDecision | None = None
        self._n_tokens = 0                # index of the next appended token
        self._n_signals = 0               # index of the next add_signal
        self._pending: dict[int, tuple[float, ...]] = {}  # signals not yet folded in
        self._is_think: deque[bool] = deque()  # per token in [_applied, _n_tokens)
        self._applied = 0                 # indices < this are folded into the EWMA
        self._ewma: list[float] | None = None

    def fork(self) -> "ExitTracker":
        """A cheap independent copy, for hypothetical look-ahead over draft tokens."""
        c = copy.copy(self)
        c._pending = dict(self._pending)
        c._is_think = deque(self._is_think)
        c._ewma = None if self._ewma is None else list(self._ewma)
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
        return {} if self._ewma is None else dict(zip(SIGNALS, self._ewma))

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
                self._ewma = list(vals) if self._ewma is None else [
                    a * x + (1.0 - a) * e for x, e in zip(vals, self._ewma)]
            self._applied += 1

    def _check_signals(self, t: int) -> None:
        # _advance() ran at the top of append(), so _applied < t means a gap.
        if self._applied < t:
            raise RuntimeError(
                f"exit check at split token {t} needs the signals of all earlier tokens, but those "
                f"of token {self._applied} are missing (contract: add_signal for every index < t "
                f"before append of token t)")
        if self._ewma is None:
            return  # no think-token signal yet: nothing to judge on
        s = dict(zip(SIGNALS, self._ewma))
        passes = {"confidence": s["confidence"] > self.cfg.confidence_threshold,
                  "progress": s["progress"] > self.cfg.progress_threshold,
                  "remaining": s["remaining"] < self.cfg.remaining_threshold}
        if all(passes[name] for name in self._signals_used):
            self._decision = ExitDecision(t, "signals", self._think_tokens, s)


def decide(token_ids: Sequence[int], signals: Sequence[Sequence[float]], cfg: ExitConfig, *,
           split_token_ids: Iterable[int], think_start_id: int, think_end_id: int,
           in_think: bool = True) -> ExitDecision | None:
    """Reference decision for a whole sequence (``signals[i]`` belongs to ``token_ids[i]``)."""
    if len(signals) != len(token_ids):
        raise ValueError(f"need one signal triple per token: {len(token_ids)} tokens, {len(signals)} signals")
    tracker = ExitTracker(cfg, split_token_ids=split_token_ids, think_start_id=think_start_id,
                          think_end_id=think_end_id, in_think=in_think)
    for tok, sig in zip(token_ids, signals):
        tracker.add_signal(sig)
        decision = tracker.append(tok)
        if decision is not None:
            return decision
    return None
