"""The EWMA that smooths each signal over the think tokens (the paper's default weight: alpha = 0.1).

One step function, used by the live tracker (and so by every engine and calibration's replay), by
the report's signal plots and, compiled, by the vLLM hook's batch scan (exit/batch_scan.py).
"""

from __future__ import annotations

from collections.abc import Iterable


def ewma_step(prev: float | None, value: float, alpha: float) -> float:
    """The average after one more value; the first value starts it (no bias towards 0)."""
    return value if prev is None else ewma_update(prev, value, alpha)


def ewma_update(prev: float, value: float, alpha: float) -> float:
    """One step of an average that exists (with alpha = 1 and a finite `prev`: exactly `value`)."""
    return alpha * value + (1.0 - alpha) * prev


def ewma(values: Iterable[float], alpha: float) -> list[float]:
    """The running average after each value of a series."""
    out: list[float] = []
    e: float | None = None
    for x in values:
        e = ewma_step(e, x, alpha)
        out.append(e)
    return out
