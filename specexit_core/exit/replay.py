"""Offline replay of the exit over a finished trace, for calibration.

The decision depends only on the tokens and their signals, so one pass of an `ExitTracker` per
(trace, alpha) records every check it makes (`exit_checks`); any threshold setting with that
alpha then exits at the first recorded check that `first_exit` finds passing -- with the same
`passes` the live tracker applies. `decide(...)` gives the same answer one sequence at a time
(tests/unit/test_evaluate_rules.py checks it); this is the fast form for a grid of settings.
`CheckTable` holds the checks of many traces as arrays and `first_exits` answers `first_exit` for
all of them at once, with `signal_passes`, the same comparison elementwise: calibration replays
thousands of settings over thousands of traces (tests/unit/test_replay_table.py checks they agree).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from specexit_core.exit.policy import ExitCheck, ExitTracker
from specexit_core.exit.settings import NEVER_FIRES, ExitConfig
from specexit_core.exit.signal_names import SIGNALS
from specexit_core.exit.thresholds import passes, signal_passes


def exit_checks(
    token_ids: Sequence[int],
    signals: Sequence[Sequence[float]],
    *,
    alpha: float,
    split_token_ids: Iterable[int],
    think_start_id: int,
    think_end_id: int,
    in_think: bool = True,
) -> list[ExitCheck]:
    """Every check an ExitTracker smoothing with `alpha` makes along the sequence (each split token
    inside the think segment with a smoothed think-token signal before it), with what it compares."""
    checks: list[ExitCheck] = []
    tracker = ExitTracker(
        ExitConfig(alpha=alpha, **NEVER_FIRES),
        split_token_ids=split_token_ids,
        think_start_id=think_start_id,
        think_end_id=think_end_id,
        in_think=in_think,
        on_check=checks.append,
    )
    for tok, sig in zip(token_ids, signals):
        tracker.add_signal(sig)
        tracker.append(tok)
        if tok == think_end_id:
            break  # no checks after </think>
    return checks


def first_exit(checks: Sequence[ExitCheck], cfg: ExitConfig) -> ExitCheck | None:
    """The check at whose split token `cfg` exits (None: no exit), from the checks recorded with
    `cfg.alpha`; the tracker's rule: min_think_tokens reached and `passes`. Its `index` is the split
    token's position in the sequence, its `think_tokens` the think tokens the exit keeps (the
    tracker's own count: a `<think>` written by the model is not one of them)."""
    _replayable(cfg)
    if not cfg.enabled:
        return None
    for c in checks:
        if c.think_tokens >= cfg.min_think_tokens and passes(c.smoothed, cfg):
            return c
    return None


def _replayable(cfg: ExitConfig) -> None:
    if cfg.max_think_tokens is not None:
        raise ValueError(
            "replay judges the signal exit at paragraph breaks only; a max_think_tokens budget needs the engine"
        )


class CheckTable:
    """The checks of many traces (each trace's `exit_checks` at one alpha), as flat arrays: every
    signal's smoothed value and the think tokens at each check, and where each trace's checks start."""

    def __init__(self, checks_per_trace: Sequence[Sequence[ExitCheck]]):
        flat = [c for checks in checks_per_trace for c in checks]
        self.n_traces = len(checks_per_trace)
        self.counts = np.array([len(c) for c in checks_per_trace], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self.trace_of = np.repeat(np.arange(self.n_traces), self.counts)
        self.think_tokens = np.array([c.think_tokens for c in flat], dtype=np.int64)
        self.smoothed = {name: np.array([c.smoothed[name] for c in flat], dtype=float) for name in SIGNALS}


def first_exits(table: CheckTable, cfg: ExitConfig) -> np.ndarray:
    """`first_exit` for every trace of the table: per trace, the position of its exit check among its
    own checks, -1 where it does not exit. The same rule: min_think_tokens reached and every signal the
    method uses past its threshold (`signal_passes`, elementwise)."""
    _replayable(cfg)
    out = np.full(table.n_traces, -1, dtype=np.int64)
    if not cfg.enabled or len(table.think_tokens) == 0:
        return out
    ok = table.think_tokens >= cfg.min_think_tokens
    for name in cfg.signals_used:
        ok &= signal_passes(name, table.smoothed[name], cfg)
    hits = np.flatnonzero(ok)
    if hits.size:
        traces, first = np.unique(table.trace_of[hits], return_index=True)  # hits are in trace order
        out[traces] = hits[first] - table.starts[traces]
    return out
