"""The vLLM hook's per-step work, compiled (numba, which vLLM itself uses for its n-gram drafter):
`_cpu_rows` (on CPU, the signal rows of just the followed requests' logit rows) and `step_rows` (one
loop over the followed requests: committed tokens from the step inputs (`stream_row`), the exit scan
(`batch_scan.scan_row`), the rows kept for the next step (`advance_row`)). One call each per step:
no Python and no per-array-operation overhead per request.

Imported by the hook at its first step, never at plugin load (see batch_scan's docstring: numba at
plugin load breaks vLLM's CPU worker start).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from specexit_core import signals
from specexit_core.compiled_cache import drop_stale_cache
from specexit_core.exit import batch_layout, batch_scan, smoothing
from specexit_core.exit.batch_scan import scan_row
from specexit_core.signals import activate_value

LOST, ATTENTION = 1, 2  # `step_rows` flags per followed request


# the loops inline batch_scan's scan (its EWMA step and codes) and signals.activate_value
drop_stale_cache(__file__, [batch_scan.__file__, smoothing.__file__, batch_layout.__file__, signals.__file__])


@njit(cache=True, nogil=True)
def stream_row(rs, s, m, gen0, tok_rows, sig_rows, first, nd, tok, sig, valid, last_gen0, last_input0) -> bool:
    """Column `m` of the stream (`tok`, `sig`, `valid`: [W - 1 + K + 1, M]) for slot `s`, whose rows
    this step are `first .. first + nd` of `tok_rows` / `sig_rows` at generated indices gen0 ..:
    [last step's drafts 1..W-1, valid where accepted | input 0, valid unless it repeats last step's
    input 0 | this step's drafts, the last one repeated (invalid) up to K]. `rs` is
    `CommittedRows.state()`. Returns whether the committed tokens are lost: more accepted than last
    step had rows, gen0 went back, or the same gen0 with another input 0."""
    _, last_gen0_of, last_n_of, last_tok_of, last_sig_of = rs
    w1 = last_tok_of.shape[0] - 1
    k1 = tok.shape[0] - w1
    n_sig = sig.shape[2]
    lg = last_gen0_of[s]
    a1 = gen0 - lg  # drafts accepted + 1 (0: the same input 0 as last step)
    last_gen0[m] = lg
    last_input0[m] = last_tok_of[0, s]
    for j in range(w1):
        tok[j, m] = last_tok_of[j + 1, s]
        for i in range(n_sig):
            sig[j, m, i] = last_sig_of[j + 1, s, i]
        valid[j, m] = j + 1 < a1  # last step's draft j + 1: accepted
    for j in range(k1):
        row = first + min(j, nd)
        tok[w1 + j, m] = tok_rows[row]
        for i in range(n_sig):
            sig[w1 + j, m, i] = sig_rows[row, i]
        valid[w1 + j, m] = j <= nd
    valid[w1, m] = a1 > 0  # input 0, unless it was last step's input 0 too
    return a1 > last_n_of[s] or a1 < 0 or (a1 == 0 and tok_rows[first] != last_tok_of[0, s])


@njit(cache=True, nogil=True)
def advance_row(rs, s, m, gen0, nd, tok, sig) -> None:
    """Stream column `m`'s rows of this step become slot `s`'s `last step` for the next one."""
    _, last_gen0, last_n, last_tok, last_sig = rs
    w1 = last_tok.shape[0] - 1
    k1 = tok.shape[0] - w1
    last_gen0[s] = gen0
    last_n[s] = nd + 1
    for j in range(k1):
        last_tok[j, s] = tok[w1 + j, m]
        for i in range(sig.shape[2]):
            last_sig[j, s, i] = sig[w1 + j, m, i]


_activate_value = njit(cache=True, nogil=True)(activate_value)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def cpu_rows(layers, rows, blocks, ids, positions):
    """`SpecExitRunnerState._host_rows` on CPU for logit rows `rows`: (signals [R, 3] float64, token ids, positions).
    Per row, the signal rows of `fc` times the row's aux hidden states (`layers`: [T, hidden]
    float32 each; `blocks`: [layers, 3, hidden]), summed in float32, then `activate_value`. One
    row's result is the same compiled loop whatever other rows are computed, so the same bits (the
    float32 sum may be reordered to vectorise it, the same way for every row); the activation keeps
    IEEE semantics (NaN stays NaN)."""
    n_sig, hidden = blocks.shape[1], blocks.shape[2]
    sig = np.empty((len(rows), n_sig))
    tok = np.empty(len(rows), np.int64)
    pos = np.empty(len(rows), np.int64)
    for r in range(len(rows)):
        t = rows[r]
        tok[r], pos[r] = ids[t], positions[t]
        for i in range(n_sig):
            acc = np.float32(0.0)
            for li in range(len(layers)):
                h = layers[li]
                for j in range(hidden):
                    acc += h[t, j] * blocks[li, i, j]
            sig[r, i] = _activate_value(i, np.float64(acc))
    return sig, tok, pos


@njit(cache=True, nogil=True)
def step_rows(code_of, st, rs, slots, first, n_drafts, tok_rows, sig_rows, pos_rows, pending, ev, out, flags):
    """One step of the followed requests (slots `slots`; request m's logit rows are `first[m] ..
    first[m] + n_drafts[m]` of `tok_rows` / `sig_rows` / `pos_rows`): gen0 from input 0's
    position, its stream column (`stream_row`), the exit scan (`scan_row`, not for lost or exited
    requests), and its rows kept for the next step (`advance_row`). A prefill row (its input 0 is
    a prompt token: gen0 < 0) is skipped. `out`: the stream's arrays (gen0, last_gen0, last_input0,
    tok, sig, valid; committed columns: below `rs`'s row width). `flags[m]`: LOST, and ATTENTION where Python must look
    (lost, an event, a pending exit, exited, or thinking over)."""
    exited, ended = st[4], st[3]
    n_prompt = rs[0]
    gen0, last_gen0, last_input0, tok, sig, valid = out
    n_commit = rs[3].shape[0]
    e = np.empty(sig.shape[2])  # scan_row's running average, reused request after request
    for m in range(len(slots)):
        s, f, nd = slots[m], first[m], n_drafts[m]
        g0 = pos_rows[f] - n_prompt[s]
        gen0[m] = g0
        flags[m] = 0
        if g0 < 0:
            continue
        lost = stream_row(rs, s, m, g0, tok_rows, sig_rows, f, nd, tok, sig, valid, last_gen0, last_input0)
        was_exited = exited[s]
        event = False
        if not (lost or was_exited):
            event = scan_row(code_of, st, s, m, tok, sig, valid, n_commit, ev, e)
        advance_row(rs, s, m, g0, nd, tok, sig)
        if lost:
            flags[m] = LOST | ATTENTION
        elif event or pending[s] or was_exited or ended[s]:
            flags[m] = ATTENTION
