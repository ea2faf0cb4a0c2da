"""The EWMA that smooths each signal over the think tokens (the paper's default weight: alpha = 0.1).

One step function, used by the live tracker (and so by every engine and calibration's replay) and
by the report's signal plots.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def ewma_step(prev: float | None, value: float, alpha: float) -> float:
    """The average after one more value; the first value starts it (no bias towards 0)."""
    return value if prev is None else alpha * value + (1.0 - alpha) * prev


def ewma(values: Iterable[float], alpha: float) -> list[float]:
    """The running average after each value of a series."""
    out: list[float] = []
    e: float | None = None
    for x in values:
        e = ewma_step(e, x, alpha)
        out.append(e)
    return out


def ewma_columns(start: np.ndarray, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Many averages at once, column by column: `start` [N, S], `values` [L, N, S], `weights` [L, N, 1]
    (per element the alpha of `ewma_step`; 1 starts an average at its value, 0 leaves it as it is).
    Returns [L + 1, N, S]: the averages before each column, and after the last. The same float64
    operations as `ewma_step` (w * x + (1 - w) * e), so the same bits."""
    out = np.empty((len(values) + 1, *start.shape))
    out[0] = start
    wx = weights * values
    keep = 1.0 - weights
    for c in range(len(values)):
        np.multiply(keep[c], out[c], out=out[c + 1])
        out[c + 1] += wx[c]
    return out
