"""BatchTrackers (the hook's numpy form of the exit decision) against ExitTracker, driven the way the
vLLM hook drove one ExitTracker per request: committed tokens with their signals, then a look-ahead
over the drafts from a fork when a draft is a split token or the budget ends within them. Random
token/signal streams, multi-token commits, drafts, per-request settings (method, thresholds,
alpha, min/max think tokens), non-finite signals; decisions must agree bit for bit."""

import math
import random

import numpy as np
import pytest

from specexit_core.exit import ExitConfig, ExitTracker
from specexit_core.exit.batch_tracker import BUDGET, DECISION, ERROR, BatchTrackers

TS, TE, SPLITS = 1, 2, (3, 4)
METHODS = ["confidence", "progress", "remain", "confidence_progress", "progress_remain", "confidence_progress_remain"]


def random_cfg(rng: random.Random) -> ExitConfig:
    mn = rng.choice([0, 0, 3, 10])
    return ExitConfig(
        method=rng.choice(METHODS),
        confidence_threshold=rng.choice([0.3, 0.5, 0.6, 0.8]),
        progress_threshold=rng.choice([0.2, 0.4, 0.5, 0.7]),
        remaining_threshold=rng.choice([50.0, 150.0, 300.0]),
        alpha=rng.choice([0.05, 0.1, 0.3, 0.5, 1.0]),
        min_think_tokens=mn,
        max_think_tokens=rng.choice([None, None, mn + rng.randrange(1, 40)]),
    )


def random_token(rng: random.Random, markers: bool = True) -> int:
    u = rng.random()
    if not markers:  # no <think>/</think>: the scan's fast paths (nothing ended, no markers)
        return rng.choice(SPLITS) if u < 0.2 else rng.randrange(5, 50)
    if u < 0.2:
        return rng.choice(SPLITS)
    if u < 0.23:
        return TE
    if u < 0.25:
        return TS
    return rng.randrange(5, 50)


def random_signal(rng: random.Random, nan_share: float) -> tuple[float, float, float]:
    if rng.random() < nan_share:
        return (float("nan"), 0.5, 1.0) if rng.random() < 0.5 else (0.5, float("inf"), 1.0)
    v = (rng.random(), rng.random(), rng.random() * 400)
    return tuple(0.5 if rng.random() < 0.05 else x for x in v)  # exact ties with thresholds too


def reference_step(tr: ExitTracker, committed, drafts):
    """The old hook's per-request step: returns (index in committed+drafts, committed?, kind, decision|None)."""
    for i, (tok, sig) in enumerate(committed):
        try:
            tr.add_signal(sig)
        except ValueError:
            return i, True, ERROR, None
        dec = tr.append(tok)
        if dec is not None:
            return i, True, dec.reason, dec
    if not tr.in_think or not drafts or tr.exited:
        return None
    budget = tr.cfg.max_think_tokens
    if (budget is None or tr.think_tokens + len(drafts) < budget) and not any(t in SPLITS for t, _ in drafts):
        return None
    hyp = tr.fork()
    for j, (tok, _) in enumerate(drafts):
        if j > 0:
            try:
                hyp.add_signal(drafts[j - 1][1])
            except ValueError:
                return len(committed) + j, False, ERROR, None
        dec = hyp.append(tok)
        if dec is not None:
            return len(committed) + j, False, dec.reason, dec
        if not hyp.in_think:
            return None
    return None


@pytest.mark.parametrize("seed", range(18))
def test_batch_trackers_decide_as_exit_tracker(seed):
    rng = random.Random(seed)
    nan_share = [0.0, 0.0, 0.01, 0.05][seed % 4]
    n_req = rng.choice([1, 5, 33])
    bt = BatchTrackers(split_token_ids=SPLITS, think_start_id=TS, think_end_id=TE, capacity=2)
    live = {}  # slot -> ExitTracker
    for _ in range(n_req):
        cfg = random_cfg(rng)
        live[bt.add(cfg)] = ExitTracker(cfg, split_token_ids=SPLITS, think_start_id=TS, think_end_id=TE)
    n_events = 0
    for _step in range(60):
        if not live:
            break
        slots = np.array(sorted(live), np.int64)
        p = rng.randrange(1, 6)  # committed columns, some left empty (gaps, like the hook's layout)
        k = rng.randrange(0, 5)
        tok = np.full((p + k, len(slots)), -1, np.int64)
        x = np.zeros((p + k, len(slots), 3))
        valid = np.zeros((p + k, len(slots)), bool)
        want = {}
        cols_of = {}
        for r, slot in enumerate(slots.tolist()):
            m = rng.randrange(0, p + 1)
            cols = sorted(rng.sample(range(p), m)) + list(range(p, p + rng.randrange(0, k + 1)))
            stream = [(random_token(rng, seed % 3 != 0), random_signal(rng, nan_share)) for _ in cols]
            for c, (t, sig) in zip(cols, stream):
                tok[c, r], x[c, r], valid[c, r] = t, sig, True
            cols_of[r] = cols
            want[r] = reference_step(live[slot], stream[:m], stream[m:])
        events = {ev.row: ev for ev in bt.scan(slots, tok, x, valid, p)}
        for r, slot in enumerate(slots.tolist()):
            w, ev = want[r], events.get(r)
            if w is None:
                assert ev is None, (seed, _step, r, ev)
                continue
            i, committed, kind, dec = w
            assert ev is not None and ev.col == cols_of[r][i] and ev.committed == committed and ev.kind == kind
            n_events += 1
            if dec is not None:
                assert ev.think_tokens == dec.think_tokens
                assert ev.smoothed == dec.smoothed  # bit for bit
                assert kind in (DECISION, BUDGET)
            if committed or kind == ERROR:
                del live[slot]
                bt.free(slot)
        for slot, tr in live.items():
            assert int(bt.think[slot]) == tr.think_tokens
            assert bool(bt.ended[slot]) == (not tr.in_think)
            avg = tr.smoothed()
            if avg:
                assert bt.ema[slot].tolist() == list(avg.values())
    assert n_events > 0 or n_req == 1


def test_slots_are_reused_and_grow():
    bt = BatchTrackers(split_token_ids=SPLITS, think_start_id=TS, think_end_id=TE, capacity=1)
    slots = [bt.add(ExitConfig()) for _ in range(5)]
    assert slots == [0, 1, 2, 3, 4] and bt.capacity >= 5
    bt.free(2)
    assert bt.add(ExitConfig(alpha=0.5)) == 2 and bt.alpha[2] == 0.5 and bt.think[2] == 0
    with pytest.raises(ValueError):
        bt.add(ExitConfig(enabled=False))
    assert not math.isnan(bt.ema.sum())
