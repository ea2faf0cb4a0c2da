"""Bootstrap intervals for accuracy (pure functions, seeded, unit-tested).

- `accuracy_ci95(correct)`: percentile bootstrap interval of one method's accuracy (resampling problems).
- `paired_diff_ci95(a, b)`: the paired difference a - b in accuracy (problems resampled once for both
  methods, so what the two share cancels), with its percentile bootstrap interval.
- `within_points(diff, points)`: a "within N points" target judged on the interval, not the point estimate.
- `paired_ratio_ci95(num, den)`: a speed-up, mean latency of `num` over that of `den` on the same timed
  problems, with its percentile bootstrap interval (problems resampled once for both).

The same seed gives the same interval, so a summary is reproducible from its rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

RESAMPLES = 2000
SEED = 0


def _percentiles(stats: np.ndarray) -> list[float]:
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return [float(lo), float(hi)]


def accuracy_ci95(correct: Sequence[bool], *, seed: int = SEED, resamples: int = RESAMPLES) -> list[float] | None:
    """[low, high] of the mean of `correct` (fractions), or None when there is nothing to resample."""
    x = np.asarray(correct, dtype=float)
    if x.size == 0:
        return None
    idx = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    return _percentiles(x[idx].mean(axis=1))


def paired_diff_ci95(
    a: Mapping[str, bool], b: Mapping[str, bool], *, seed: int = SEED, resamples: int = RESAMPLES
) -> dict | None:
    """Accuracy of `a` minus accuracy of `b` on the problems both answered (keys: problem ids), in
    points (percent): {"points", "ci95": [low, high], "n"}; None when they share no problem."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    d = np.asarray([float(a[k]) - float(b[k]) for k in common])
    idx = np.random.default_rng(seed).integers(0, d.size, size=(resamples, d.size))
    lo, hi = _percentiles(100 * d[idx].mean(axis=1))
    return {"points": float(100 * d.mean()), "ci95": [lo, hi], "n": len(common)}


def within_points(diff: Mapping | None, points: float) -> bool | None:
    """Does the whole 95% interval of a paired difference lie above -`points`? (None: no interval.)"""
    if not diff:
        return None
    return diff["ci95"][0] >= -points - 1e-9


def paired_ratio_ci95(
    num: Mapping[str, float], den: Mapping[str, float], *, seed: int = SEED, resamples: int = RESAMPLES
) -> dict | None:
    """mean(num) / mean(den) over the problems both timed (keys: problem ids), e.g. EAGLE-3's latency
    over SpecExit's: {"ratio", "ci95": [low, high], "n"}; None when they share no problem."""
    common = sorted(set(num) & set(den))
    if not common:
        return None
    a = np.asarray([float(num[k]) for k in common])
    b = np.asarray([float(den[k]) for k in common])
    if b.sum() <= 0:
        return None
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    lo, hi = _percentiles(a[idx].sum(axis=1) / np.maximum(b[idx].sum(axis=1), 1e-12))
    return {"ratio": float(a.sum() / b.sum()), "ci95": [lo, hi], "n": len(common)}
