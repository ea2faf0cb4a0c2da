"""Offline replay of the exit over a finished trace, for calibration.

The decision depends only on the tokens and their signals, so one pass of an `ExitTracker` per
(trace, alpha) records every check it makes (`exit_checks`); any threshold setting with that
alpha then exits at the first recorded check that `first_exit` finds passing -- with the same
`passes` the live tracker applies. `decide(...)` gives the same answer one sequence at a time
(tests/unit/test_evaluate_rules.py checks it); this is the fast form for a grid of settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from specexit_core.exit.policy import ExitCheck, ExitTracker
from specexit_core.exit.settings import NEVER_FIRES, ExitConfig
from specexit_core.exit.thresholds import passes


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
    if cfg.max_think_tokens is not None:
        raise ValueError(
            "replay judges the signal exit at paragraph breaks only; a max_think_tokens budget needs the engine"
        )
    if not cfg.enabled:
        return None
    for c in checks:
        if c.think_tokens >= cfg.min_think_tokens and passes(c.smoothed, cfg):
            return c
    return None
