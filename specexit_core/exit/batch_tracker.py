"""`ExitTracker`'s decision for a whole batch of requests at once, compiled (the vLLM hook's form).

`ExitTracker` costs Python work per token and per signal; at 256 running requests a decode step
commits ~1000 tokens, and the hook spent ~90 us per request-step there. `BatchTrackers` keeps what
an `ExitTracker` holds between tokens in arrays indexed by a slot per request -- the EWMA of the
three signals over the think tokens so far (and whether there is one yet), the think-token count,
whether `</think>` was seen, whether the tracker has decided -- next to the request's own settings
(alpha, the three thresholds, the signals its method uses, min/max think tokens), and `scan` folds
one step's tokens of many requests in one compiled loop (numba, which vLLM itself uses for its
n-gram drafter): no Python and no per-array-operation overhead per step (the hook's cost before
and after: docs/results/bench_hook_cpu.json).

The rules are ExitTracker's: the EWMA is `smoothing.ewma_update` compiled (so the same bits), the
comparison `thresholds.PASS_SIDE`'s. tests/unit/test_batch_tracker.py checks
decision, index, think tokens, smoothed values and errors against `ExitTracker` over many random
streams.

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

from specexit_core.exit.batch_layout import END_BIT, KIND_BUDGET, KIND_DECISION, KIND_ERROR, SPLIT_BIT, START_BIT
from specexit_core.exit.settings import ExitConfig
from specexit_core.exit.signal_names import SIGNALS
from specexit_core.exit.thresholds import PASS_SIDE

DECISION, BUDGET, ERROR = "signals", "max_think_tokens", "error"
_NO_BUDGET = np.iinfo(np.int64).max  # max_think_tokens None: a think count never reaches it


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
        self.code_of = np.zeros(max([*split, self.think_start, self.think_end]) + 2, dtype=np.uint8)
        self.code_of[split] |= SPLIT_BIT
        self.code_of[self.think_start] |= START_BIT
        self.code_of[self.think_end] |= END_BIT
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

    def state(self) -> tuple:
        """The arrays `scan_row` reads and moves, in its order (fresh after a slot grows them)."""
        return (
            self.ema,
            self.has,
            self.think,
            self.ended,
            self.exited,
            self.alpha,
            self.side_thresholds,
            self.unused,
            self.min_think,
            self.max_think,
        )

    def scan(self, slots: np.ndarray, tok: np.ndarray, x: np.ndarray, valid: np.ndarray, n_commit: int):
        """One step of rows `slots` (none exited), column-major: tokens `tok` [L, N], their signals `x`
        [L, N, 3], `valid` [L, N]; columns below `n_commit` are committed. Moves the committed state
        of every row (rows with a committed decision are then frozen, rows with an error are the
        caller's to drop), and returns the first event of every row that has one (most have none)."""
        from specexit_core.exit.batch_scan import scan_rows  # numba: see batch_scan's docstring

        ev = new_events(tok.shape[1])
        scan_rows(
            self.code_of,
            self.state(),
            np.ascontiguousarray(slots, np.int64),
            np.ascontiguousarray(tok, np.int64),
            np.ascontiguousarray(x, np.float64),
            np.ascontiguousarray(valid, np.bool_),
            int(n_commit),
            ev,
        )
        return scan_events(ev, n_commit, np.flatnonzero(ev[0] >= 0).tolist())


_KINDS = {KIND_DECISION: DECISION, KIND_BUDGET: BUDGET, KIND_ERROR: ERROR}  # the scan's kind codes, named


def new_events(n: int) -> tuple:
    """Per row: (first event's column, -1 for none; its kind; think tokens; smoothed [3])."""
    return np.full(n, -1, np.int64), np.zeros(n, np.int8), np.zeros(n, np.int64), np.zeros((n, len(SIGNALS)))


def scan_events(ev: tuple, n_commit: int, rows: list[int]) -> list[ScanEvent]:
    """ScanEvents of `rows` (rows with an event) from `new_events` arrays."""
    col, kind, think, smoothed = ev
    return [
        ScanEvent(
            r,
            int(col[r]),
            int(col[r]) < n_commit,
            _KINDS[int(kind[r])],
            int(think[r]),
            dict(zip(SIGNALS, smoothed[r].tolist())) if kind[r] == KIND_DECISION else {},
        )
        for r in rows
    ]
