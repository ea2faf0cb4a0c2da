"""What the report's figures share: the method order and colours, and pyplot without a display.

The evaluation report (job.py), the generalisation section (generalisation.py) and the
long-generation report (longgen.py) all draw with these; they live here, not in job.py, because
job.py's `main` dispatches to the other two, and a part they import back from it would close an
import circle.
"""

from __future__ import annotations

from pipelines.common.methods import METHODS

ORDER = METHODS  # the order of methods in tables, legends and bars
COLORS = {
    "plain": "#7f7f7f",
    "eagle3": "#1f77b4",
    "specexit": "#d62728",
    "specexit_paper": "#ff9896",
    "specexit_default": "#e377c2",
    "effort": "#bcbd22",
    "budget": "#9467bd",
    "deer": "#2ca02c",
    "dynasor": "#ff7f0e",
    "nothink": "#8c564b",
    "oracle": "#000000",
}


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (files only, no display); imported on first use, so
    reading a report's tables never loads matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi: int = 110) -> None:
    """Lay the figure out, write it as PNG and free it (pyplot keeps every open figure)."""
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
