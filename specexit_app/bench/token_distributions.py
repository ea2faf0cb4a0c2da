"""Do two samplers draw the same token sequences? A permutation test on per-position frequencies.

Lossless speculative sampling means: for every prompt, the sequences an engine samples with a
draft have the same distribution as the target's own samples. We check a consequence that any
bias in the accept / resample step breaks: at every position t of the continuation, the token
frequencies agree. Per prompt and position, the total-variation distance between the two
empirical distributions is

    TV_t = 1/2 * sum_v | count_A(t, v) / n_A - count_B(t, v) / n_B |

(a sequence that ended before t counts as the token `ENDED` there). The statistic is the mean of
TV_t over prompts and positions. Even for identical samplers it is above 0 (finite samples); how
far above depends on n and on each position's entropy, so the bound comes from the data: the
labels A/B are shuffled within each prompt `rounds` times (a fixed seed), and the p-value is the
share of shuffles whose statistic reaches the observed one. Exact for any n under the null
(exchangeable samples), no asymptotics, and fast: one matrix product per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ENDED = -1  # the token at positions after a sequence ended


def position_matrix(seqs: Sequence[Sequence[int]], length: int) -> np.ndarray:
    """[n, length] int64: the first `length` tokens of each sequence, ENDED after its end."""
    m = np.full((len(seqs), length), ENDED, dtype=np.int64)
    for i, s in enumerate(seqs):
        s = list(s)[:length]
        m[i, : len(s)] = s
    return m


def _indicators(pooled: np.ndarray) -> np.ndarray:
    """[N, C] 0/1: sequence i has token v at position t, one column per (t, v) seen."""
    n, length = pooled.shape
    cols = []
    for t in range(length):
        vals, inv = np.unique(pooled[:, t], return_inverse=True)
        one_hot = np.zeros((n, len(vals)), dtype=np.float64)
        one_hot[np.arange(n), inv] = 1.0
        cols.append(one_hot)
    return np.concatenate(cols, axis=1)


def _mean_tv(counts_a: np.ndarray, n_a: int, total: np.ndarray, n_b: int, length: int) -> np.ndarray:
    """Mean over positions of TV_t, for each row of counts_a [R, C] (counts_b = total - counts_a)."""
    return 0.5 * np.abs(counts_a / n_a - (total - counts_a) / n_b).sum(axis=-1) / length


def tv_per_position(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """TV_t for t = 0..length-1 between two position matrices of one prompt."""
    ind = _indicators(np.concatenate([a, b]))
    ca, cb = ind[: len(a)].sum(0), ind[len(a) :].sum(0)
    diff = np.abs(ca / len(a) - cb / len(b))
    # columns are grouped by position in order; split them back
    widths = [len(np.unique(np.concatenate([a[:, t], b[:, t]]))) for t in range(a.shape[1])]
    return 0.5 * np.array([d.sum() for d in np.split(diff, np.cumsum(widths)[:-1])])


@dataclass(frozen=True)
class SameDistributionTest:
    statistic: float  # observed mean TV over prompts and positions
    null_mean: float  # its mean over the label shuffles (what identical samplers give at this n)
    null_q999: float  # the 99.9% quantile of the shuffles
    p_value: float  # (1 + shuffles reaching the statistic) / (1 + rounds)
    rounds: int

    def summary(self) -> str:
        return (
            f"mean TV {self.statistic:.4f} (identical samplers at this n: {self.null_mean:.4f}, "
            f"99.9% {self.null_q999:.4f}), p = {self.p_value:.4g} over {self.rounds} shuffles"
        )


def same_distribution_test(
    a: Sequence[np.ndarray], b: Sequence[np.ndarray], rounds: int = 2000, seed: int = 0
) -> SameDistributionTest:
    """a[j], b[j]: position matrices (same length) of prompt j from samplers A and B."""
    if len(a) != len(b) or not a:
        raise ValueError("need the same prompts, at least one, from both samplers")
    rng = np.random.default_rng(seed)
    observed, null = 0.0, np.zeros(rounds)
    for ma, mb in zip(a, b, strict=True):
        if ma.shape[1] != mb.shape[1]:
            raise ValueError(f"position matrices of one prompt differ in length: {ma.shape} vs {mb.shape}")
        n_a, n_b, length = len(ma), len(mb), ma.shape[1]
        ind = _indicators(np.concatenate([ma, mb]))
        total = ind.sum(0)
        observed += float(_mean_tv(ind[:n_a].sum(0), n_a, total, n_b, length))
        labels = np.zeros((rounds, n_a + n_b))
        labels[:, :n_a] = 1.0
        null += _mean_tv(rng.permuted(labels, axis=1) @ ind, n_a, total, n_b, length)
    observed /= len(a)
    null /= len(a)
    return SameDistributionTest(
        statistic=observed,
        null_mean=float(null.mean()),
        null_q999=float(np.quantile(null, 0.999)),
        # a small tolerance: the same sums in another order can differ in the last bits
        p_value=float((1 + np.sum(null >= observed - 1e-12)) / (1 + rounds)),
        rounds=rounds,
    )
