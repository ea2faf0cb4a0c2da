"""Bootstrap intervals for accuracy (pure functions, seeded, unit-tested).

- `accuracy_ci95(correct)`: percentile bootstrap interval of one method's accuracy (resampling problems).
- `paired_diff_ci95(a, b)`: the paired difference a - b in accuracy (problems resampled once for both
  methods, so what the two share cancels), with its percentile bootstrap interval.
- `within_points(diff, points)`: a "within N points" target judged on the interval, not the point estimate.
- `paired_ratio_ci95(num, den)`: a speed-up, mean latency of `num` over that of `den` on the same timed
  problems, with its percentile bootstrap interval (problems resampled once for both).

With several samples per problem (`EvalConfig.samples`) the unit resampled is still the problem: the
samples of one problem share its difficulty, so they are not independent. Keys are then
`(problem id, sample)` pairs and a resampled problem brings all its samples (a cluster bootstrap);
with one sample per problem it is the ordinary bootstrap, draw for draw.

The same seed gives the same interval, so a summary is reproducible from its rows.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

RESAMPLES = 2000
SEED = 0


def problem_of(key: Hashable) -> Hashable:
    """The problem a key belongs to: a `(problem id, sample)` key's first part, else the key itself."""
    return key[0] if isinstance(key, tuple) else key


def _percentiles(stats: np.ndarray) -> list[float]:
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return [float(lo), float(hi)]


def _clustered(keys: Sequence[Hashable], *columns: Sequence[float]) -> tuple[np.ndarray, ...]:
    """Per problem (in first-seen order): the sample count, then each column's sum over its samples."""
    index: dict = {}
    for k in keys:
        index.setdefault(problem_of(k), len(index))
    which = np.fromiter((index[problem_of(k)] for k in keys), dtype=np.int64, count=len(keys))
    counts = np.bincount(which, minlength=len(index)).astype(float)
    return (counts, *(np.bincount(which, weights=np.asarray(c, dtype=float), minlength=len(index)) for c in columns))


def _draws(n: int, seed: int, resamples: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def accuracy_ci95(
    correct: Sequence[bool],
    *,
    keys: Sequence[Hashable] | None = None,
    seed: int = SEED,
    resamples: int = RESAMPLES,
) -> list[float] | None:
    """[low, high] of the mean of `correct` (fractions), or None when there is nothing to resample.
    `keys`: each value's `(problem id, sample)`, to resample problems rather than values."""
    if len(correct) == 0:
        return None
    counts, hits = _clustered(keys if keys is not None else range(len(correct)), correct)
    idx = _draws(counts.size, seed, resamples)
    return _percentiles(hits[idx].sum(axis=1) / counts[idx].sum(axis=1))


def paired_diff_ci95(
    a: Mapping[Hashable, bool], b: Mapping[Hashable, bool], *, seed: int = SEED, resamples: int = RESAMPLES
) -> dict | None:
    """Accuracy of `a` minus accuracy of `b` on what both answered (keys: problem ids, or `(problem id,
    sample)` pairs), in points (percent): {"points", "ci95": [low, high], "n", "problems"} (`n`: the
    problem-samples compared); None when they share nothing."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    counts, diff = _clustered(common, [float(a[k]) - float(b[k]) for k in common])
    idx = _draws(counts.size, seed, resamples)
    lo, hi = _percentiles(100 * diff[idx].sum(axis=1) / counts[idx].sum(axis=1))
    return {
        "points": float(100 * diff.sum() / counts.sum()),
        "ci95": [lo, hi],
        "n": len(common),
        "problems": counts.size,
    }


def within_points(diff: Mapping | None, points: float) -> bool | None:
    """Does the whole 95% interval of a paired difference lie above -`points`? (None: no interval.)"""
    if not diff:
        return None
    return diff["ci95"][0] >= -points - 1e-9


def paired_ratio_ci95(
    num: Mapping[Hashable, float], den: Mapping[Hashable, float], *, seed: int = SEED, resamples: int = RESAMPLES
) -> dict | None:
    """mean(num) / mean(den) over what both timed (keys as in `paired_diff_ci95`), e.g. EAGLE-3's
    latency over SpecExit's: {"ratio", "ci95": [low, high], "n"}; None when they share nothing."""
    common = sorted(set(num) & set(den))
    if not common:
        return None
    _, a, b = _clustered(common, [float(num[k]) for k in common], [float(den[k]) for k in common])
    if b.sum() <= 0:
        return None
    idx = _draws(a.size, seed, resamples)
    lo, hi = _percentiles(a[idx].sum(axis=1) / np.maximum(b[idx].sum(axis=1), 1e-12))
    return {"ratio": float(a.sum() / b.sum()), "ci95": [lo, hi], "n": len(common)}
