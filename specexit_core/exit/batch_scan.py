"""`BatchTrackers.scan` compiled: `scan_row` is one request's step, `scan_rows` many (numba, which
vLLM itself uses for its n-gram drafter; the vLLM hook calls `scan_row` from its own per-step loop).

Imported only when a scan first runs, never at plugin load: importing numba loads llvmlite, whose
`ffi.lib` answers every attribute, and vLLM's CPU worker, registering its kernel overrides at start,
reads `vars()` of every module attribute and dies on it (`'_lib_fn_wrapper' object has no
attribute 'get'`). tests/unit/test_compiled_imports.py keeps the plugin's import path free of it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from specexit_core.compiled_cache import drop_stale_cache
from specexit_core.exit import batch_layout, smoothing
from specexit_core.exit.batch_layout import END_BIT, KIND_BUDGET, KIND_DECISION, KIND_ERROR, SIDE, SPLIT_BIT, START_BIT
from specexit_core.exit.smoothing import ewma_update

drop_stale_cache(__file__, [smoothing.__file__, batch_layout.__file__])  # the scan inlines the EWMA step and the codes
_ewma_update = njit(cache=True, nogil=True)(ewma_update)


@njit(cache=True, nogil=True)
def scan_rows(code_of, st, slots, tok, x, valid, p, ev):
    e = np.empty(x.shape[2])  # scan_row's running average, reused row after row
    for r in range(tok.shape[1]):
        scan_row(code_of, st, slots[r], r, tok, x, valid, p, ev, e)


@njit(cache=True, nogil=True)
def scan_row(code_of, st, s, r, tok, x, valid, p, ev, e):
    """`BatchTrackers.scan` of row `r` (slot `s`) of column-major `tok` / `x` / `valid`, column by
    column: ExitTracker's rules on arrays; `st` is `BatchTrackers.state()`, `ev` `new_events`'s
    arrays, `e` scratch for the running average ([3]: no allocation per row). Returns whether the
    row has an event.

    A column is a think token when valid and neither `<think>`, `</think>` nor after a `</think>`.
    Its weight is alpha (1 for the first think token: it starts the average; 0 for other tokens),
    and the average moves by `smoothing.ewma_update`, compiled (ExitTracker's `ewma_step` is the
    same function), so the same bits. A row's first event: a split think token past
    min_think_tokens, with an average before it whose every used signal passes its threshold; the
    think token that reaches max_think_tokens; a non-finite signal where ExitTracker.add_signal
    would raise (a committed token's own signal; a draft's the previous draft's, only when the
    look-ahead runs: a split token among the drafts, or the budget within reach). The committed
    state (columns < p) is written back; a committed decision freezes the row."""
    ema, has, think, ended, exited, alpha, side_thr, unused, min_think, max_think = st
    ev_col, ev_kind, ev_think, ev_smoothed = ev
    width = tok.shape[0]
    n_sig = x.shape[2]
    n_code = code_of.shape[0]
    a = alpha[s]
    mx = max_think[s]
    for i in range(n_sig):
        e[i] = ema[s, i]
    has_avg = has[s]
    n_think = think[s]
    is_ended = ended[s]
    # the look-ahead over the drafts runs (so their signals are checked) only with a split token
    # among them or the budget within reach of the committed think count plus the valid drafts
    look_ahead = False
    n_valid_drafts = 0
    for c in range(p, width):
        if valid[c, r]:
            n_valid_drafts += 1
            t = min(max(tok[c, r], 0), n_code - 1)
            if (code_of[t] & SPLIT_BIT) != 0:
                look_ahead = True
    col = -1
    kind = 0
    prev_finite = True  # the previous column's signal (a draft's check reads it)
    for c in range(width):
        if c == p:  # the committed state: after the last committed column
            if not look_ahead and n_think + n_valid_drafts >= mx:
                look_ahead = True
            for i in range(n_sig):
                ema[s, i] = e[i]
            has[s] = has_avg
            think[s] = n_think
            ended[s] = is_ended
        v = valid[c, r]
        finite = True
        for i in range(n_sig):
            if not np.isfinite(x[c, r, i]):
                finite = False
        if not v:
            prev_finite = finite
            continue
        t = min(max(tok[c, r], 0), n_code - 1)
        code = code_of[t]
        is_end = (code & END_BIT) != 0
        in_think = not (is_ended or is_end or (code & START_BIT) != 0)
        # where ExitTracker.add_signal raises: a committed token's own signal, or a draft's
        # (the previous column's) while the look-ahead runs and thinking is not over
        bad_committed = c < p and not finite
        bad_draft = c > p and not prev_finite and look_ahead and not is_ended
        stop = KIND_ERROR if bad_committed or bad_draft else -1
        if in_think:
            n_think += 1
            if stop < 0 and n_think == mx:
                stop = KIND_BUDGET
            elif stop < 0 and (code & SPLIT_BIT) != 0 and has_avg and n_think >= min_think[s]:
                ok = True
                for i in range(n_sig):
                    ok = ok and (unused[s, i] or e[i] * SIDE[i] > side_thr[s, i])
                if ok:
                    stop = KIND_DECISION
        if stop >= 0 and col < 0:  # the row's first event; the average is the one before it
            col, kind, ev_think[r] = c, stop, n_think
            for i in range(n_sig):
                ev_smoothed[r, i] = e[i]
        if in_think:
            w = a if has_avg else 1.0
            for i in range(n_sig):
                xv = x[c, r, i] if finite else 0.0
                e[i] = _ewma_update(e[i], xv, w)
            has_avg = True
        if is_end:
            is_ended = True
        prev_finite = finite
    if p >= width:  # every column committed
        for i in range(n_sig):
            ema[s, i] = e[i]
        has[s] = has_avg
        think[s] = n_think
        ended[s] = is_ended
    ev_col[r] = col
    ev_kind[r] = kind
    if col >= 0 and col < p and kind != KIND_ERROR:  # decided on a committed token: frozen from here on
        exited[s] = True
        think[s] = ev_think[r]
    return col >= 0
