"""`ExitTracker`'s decision for a whole batch of requests at once, in numpy (the vLLM hook's form).

`ExitTracker` costs Python work per token and per signal; at 256 running requests a decode step
commits ~1000 tokens, and the hook spent ~90 us per request-step there. `BatchTrackers` keeps what
an `ExitTracker` holds between tokens in arrays indexed by a slot per request -- the EWMA of the
three signals over the think tokens so far (and whether there is one yet), the think-token count,
whether `</think>` was seen, whether the tracker has decided -- next to the request's own settings
(alpha, the three thresholds, the signals its method uses, min/max think tokens), and `scan` folds
one step's tokens of many requests with a handful of array operations per token column.

The rules are ExitTracker's: the EWMA is `smoothing.ewma_columns` (`ewma_step`'s float64 operations,
column by column, so the same bits), the comparison `thresholds.PASS_SIDE`'s. tests/unit/test_batch_tracker.py checks decision, index, think tokens,
smoothed values and errors against `ExitTracker` over many random streams.

One row of a scan is one request's step, as the hook feeds an `ExitTracker`:

* columns `[0, n_commit)`: committed tokens, each with its own signal given first
  (`add_signal(x); append(tok)`), in order; they move the request's state;
* columns `[n_commit, L)`: hypothetical drafts, looked at from a copy of the state after the
  committed ones (`fork()`; the signal of a draft is given before the next draft) -- only when one
  of them is a split token or the budget ends within them, as the hook's look-ahead; the state does
  not move.

A row stops at its first event: a decision (signals at a split token, or the budget), or a
non-finite signal (where `ExitTracker.add_signal` raises). Invalid columns (`valid` False) are
skipped, so rows of one scan may hold different numbers of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specexit_core.exit.settings import ExitConfig
from specexit_core.exit.signal_names import SIGNALS
from specexit_core.exit.smoothing import ewma_columns
from specexit_core.exit.thresholds import PASS_SIDE

DECISION, BUDGET, ERROR = "signals", "max_think_tokens", "error"
_NO_BUDGET = np.iinfo(np.int64).max  # max_think_tokens None: a think count never reaches it
_SIDE = np.array([PASS_SIDE[s] for s in SIGNALS])  # per signal: +1 passes above its threshold, -1 below
_SPLIT, _START, _END = 1, 2, 4  # token class bits: split token, `<think>`, `</think>`


@dataclass(frozen=True)
class ScanEvent:
    """The first event of one row: `col` is its column; `committed` whether it is a committed one."""

    row: int
    col: int
    committed: bool
    kind: str  # DECISION, BUDGET or ERROR
    think_tokens: int  # think tokens up to and including the token at `col`
    smoothed: dict[str, float]  # EWMA over the think tokens before `col` (empty for BUDGET, ERROR)


class BatchTrackers:
    """ExitTracker state (after its signals are folded in) for many requests, one slot each."""

    def __init__(self, *, split_token_ids, think_start_id: int, think_end_id: int, capacity: int = 16):
        split = [int(t) for t in split_token_ids]
        self.think_start, self.think_end = int(think_start_id), int(think_end_id)
        # class bits by token id, one lookup per step; the last entry (0) also answers for ids past it
        self._code = np.zeros(max([*split, self.think_start, self.think_end]) + 2, dtype=np.uint8)
        self._code[split] |= _SPLIT
        self._code[self.think_start] |= _START
        self._code[self.think_end] |= _END
        self._free: list[int] = []
        self._n = 0
        self._alloc(capacity)

    def _alloc(self, cap: int) -> None:
        old = getattr(self, "ema", None)
        fields = {
            "ema": np.zeros((cap, len(SIGNALS))),  # EWMA per signal (valid where `has`)
            "has": np.zeros(cap, bool),  # a think-token signal has been folded in
            "think": np.zeros(cap, np.int64),  # think tokens so far
            "ended": np.zeros(cap, bool),  # `</think>` seen: never thinking again
            "exited": np.zeros(cap, bool),  # decided: frozen
            "alpha": np.ones(cap),
            "side_thresholds": np.zeros((cap, len(SIGNALS))),  # PASS_SIDE * threshold, in SIGNALS order
            "unused": np.ones((cap, len(SIGNALS)), bool),  # the signals the method does not check (they pass)
            "min_think": np.zeros(cap, np.int64),
            "max_think": np.full(cap, _NO_BUDGET, np.int64),
        }
        for name, arr in fields.items():
            if old is not None:
                arr[: len(getattr(self, name))] = getattr(self, name)
            setattr(self, name, arr)

    @property
    def capacity(self) -> int:
        return len(self.ema)

    def add(self, cfg: ExitConfig) -> int:
        """A slot for a new request (an `ExitTracker(cfg, in_think=True)` that has seen nothing)."""
        if not cfg.enabled:
            raise ValueError("a disabled exit needs no tracker")
        if self._free:
            slot = self._free.pop()
        else:
            slot, self._n = self._n, self._n + 1
            if slot >= self.capacity:
                self._alloc(2 * self.capacity)
        self.ema[slot] = 0.0
        self.has[slot] = self.ended[slot] = self.exited[slot] = False
        self.think[slot] = 0
        self.alpha[slot] = cfg.alpha
        self.side_thresholds[slot] = [PASS_SIDE[s] * getattr(cfg, f"{s}_threshold") for s in SIGNALS]
        self.unused[slot] = [s not in cfg.signals_used for s in SIGNALS]
        self.min_think[slot] = cfg.min_think_tokens
        self.max_think[slot] = _NO_BUDGET if cfg.max_think_tokens is None else cfg.max_think_tokens
        return slot

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def scan(self, slots: np.ndarray, tok: np.ndarray, x: np.ndarray, valid: np.ndarray, n_commit: int):
        """One step of rows `slots` (none exited), column-major: tokens `tok` [L, N], their signals `x`
        [L, N, 3], `valid` [L, N]; columns below `n_commit` are committed. Moves the committed state
        of every row (rows with a committed decision are then frozen, rows with an error are the
        caller's to drop), and returns the first event of every row that has one (most have none)."""
        width, n = tok.shape
        p = n_commit
        # Most steps hold no `<think>`/`</think>` and no split token past the first ones, rows that all
        # have an average and are past min_think_tokens, no budget in reach and finite signals: each of
        # those cases skips its arrays (None below). One lookup classifies every valid token.
        code = np.take(self._code, tok, mode="clip")
        code *= valid
        flags = int(np.bitwise_or.reduce(code, axis=None))
        ended0 = self.ended[slots]
        ended_before = is_end = None
        is_think = valid
        if flags & (_START | _END) or ended0.any():
            is_end = (code & _END).astype(bool)
            if flags & _END or ended0.any():
                ended_before = _shifted_or(is_end, ended0)
            not_think = (code & _START).astype(bool)
            if ended_before is not None:
                not_think |= ended_before | is_end
            is_think = valid & ~not_think
        has0 = self.has[slots]
        has_before = None if has0.all() else _shifted_or(is_think, has0)
        think0, max_think = self.think[slots], self.max_think[slots]
        budgets = bool((think0 + width >= max_think).any())
        min_think = self.min_think[slots]
        think = None  # think tokens up to each column, where a rule needs them
        if budgets or not (think0 >= min_think).all():
            think = np.cumsum(is_think, axis=0)
            think += think0
        all_finite = bool(np.isfinite(x.sum()))  # a sum is finite only if every value is (else: check each)
        finite = None if all_finite else np.isfinite(x).all(axis=2)
        xs = x if all_finite else np.where(finite[..., None], x, 0.0)  # never reaches a used average
        # weight of each column's value: alpha, 1 for the first think token (starts the EWMA), 0 for
        # non-think tokens -- then each column is the tracker's ewma_step, or nothing, bit for bit.
        alpha = self.alpha[slots]
        w = np.empty(x.shape)  # as wide as the values: the EWMA's array operations then run contiguous
        w[...] = np.where(is_think, alpha if has_before is None else np.where(has_before, alpha, 1.0), 0.0)[..., None]
        before = ewma_columns(self.ema.take(slots, axis=0), xs, w)  # [L + 1, N, 3]: EWMA before each column
        split = (code & _SPLIT).astype(bool) if flags & _SPLIT else None  # `code` is 0 at invalid columns
        budget = is_think & (think == max_think) if budgets else None
        stop = None
        if split is not None:
            cand = is_think & split
            if has_before is not None:
                cand &= has_before
            if think is not None:
                cand &= think >= min_think
            if budget is not None:
                cand &= ~budget
            stop = self._passes(slots, before, cand) if cand.any() else None
        if budget is not None:
            stop = budget if stop is None else stop | budget
        err = None
        if not all_finite:
            err = np.zeros((width, n), bool)
            err[:p] = valid[:p] & ~finite[:p]  # committed: the token's own signal, given first
            if width > p + 1:  # drafts: the previous draft's signal, given before the draft (look-ahead only)
                think_commit = think0 + is_think[:p].sum(axis=0)
                look_ahead = think_commit + valid[p:].sum(axis=0) >= max_think
                if split is not None:
                    look_ahead |= split[p:].any(axis=0)
                err[p + 1 :] = valid[p + 1 :] & ~finite[p:-1] & look_ahead
                if ended_before is not None:
                    err[p + 1 :] &= ~ended_before[p + 1 :]
            stop = err if stop is None else stop | err
        if p:  # the committed state moves for every row (rows that stop are frozen or dropped below)
            last = p - 1
            self.ema[slots] = before[p]
            if has_before is not None:  # else every row has an average already
                self.has[slots] = has_before[last] | is_think[last]
            self.think[slots] = think0 + is_think[:p].sum(axis=0) if think is None else think[last]
            if ended_before is not None:
                self.ended[slots] = ended_before[last] | is_end[last]
        if stop is None:
            return []
        events = []
        for r in np.flatnonzero(stop.any(axis=0)).tolist():
            c = int(np.argmax(stop[:, r]))
            kind = (
                ERROR if err is not None and err[c, r] else BUDGET if budget is not None and budget[c, r] else DECISION
            )
            smoothed = dict(zip(SIGNALS, before[c, r].tolist())) if kind == DECISION else {}
            n_think = int(think0[r] + is_think[: c + 1, r].sum())
            events.append(ScanEvent(r, c, c < p, kind, n_think, smoothed))
            if c < p and kind != ERROR:  # decided on a committed token: frozen from here on
                self.exited[slots[r]] = True
                self.think[slots[r]] = n_think
        return events

    def _passes(self, slots: np.ndarray, before: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """`passes` at the candidate columns (split think tokens past min_think_tokens, with an
        average), each row with its own thresholds and method: `PASS_SIDE * value > PASS_SIDE *
        threshold` for every signal, or the method does not use it."""
        cols, rows = np.nonzero(cand)
        s = slots[rows]
        ok = before[cols, rows] * _SIDE > self.side_thresholds.take(s, axis=0)  # [M, 3]
        ok |= self.unused.take(s, axis=0)
        out = np.zeros(cand.shape, bool)
        out[cols, rows] = ok.all(axis=1)
        return out


def _shifted_or(flags: np.ndarray, start: np.ndarray) -> np.ndarray:
    """[L, N]: whether `start` or a flag in an earlier column is set, per row."""
    out = np.empty_like(flags)
    out[0] = start
    if len(flags) > 1:
        np.logical_or.accumulate(flags[:-1], axis=0, out=out[1:])
        out[1:] |= start
    return out
