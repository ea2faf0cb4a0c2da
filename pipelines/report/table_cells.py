"""Table cells shared by the evaluation report (job.py) and its generalisation section
(generalisation.py): a 95% interval, and the paired difference to EAGLE-3 with its interval.

Here rather than in job.py for the reason plotting.py gives: job.py's `main` dispatches to
generalisation.py, which must not import back from it.
"""

from __future__ import annotations


def ci(interval, scale: float = 100.0, nd: int = 1) -> str:
    """`[lo, hi]` scaled (default: fractions as percent), or "-" when there is none."""
    return "-" if not interval else f"[{scale * interval[0]:.{nd}f}, {scale * interval[1]:.{nd}f}]"


def vs(diff) -> str:
    """Paired accuracy difference vs eagle3 in points, with its 95% bootstrap interval."""
    return "-" if not diff else f"{diff['points']:+.1f} {ci(diff['ci95'], 1.0)}"
