"""The report's "Does the exit generalise?" section: Markdown tables and a PNG from
`_generalisation.json` (`meta_files.GENERALISATION_FILE`, written by `python -m pipelines.evaluate.generalisation`).

- per distribution, one row per method: accuracy with its 95% bootstrap interval, the paired
  difference to EAGLE-3 with its interval, think tokens, the saving against EAGLE-3;
- how far each shifted distribution moved from in distribution (accuracy, gap to EAGLE-3, saving);
- `generalisation.png`: accuracy vs think tokens, one panel per distribution.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.common.meta_files import GENERALISATION_FILE, REPORT_DIR, meta_path
from pipelines.report.plotting import COLORS, ORDER, pyplot, save_figure
from pipelines.report.table_cells import ci, vs

PLOT_FILE = "generalisation.png"


def _pts(x, nd: int = 1, sign: bool = True) -> str:
    return "-" if x is None else f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


def _saving(r: dict) -> str:
    s = r.get("think_saving_vs_eagle3")
    return "-" if s is None else f"{100 * s:.0f}%"


def distribution_table(d: dict) -> list[str]:
    lines = [
        "| method | accuracy | 95% CI | vs eagle3 (points, 95% CI) | think tokens | saving vs eagle3 | n |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in ORDER:
        r = d["methods"].get(m)
        if not r or not r.get("n"):
            continue
        lines.append(
            f"| {m} | {100 * r['accuracy']:.1f}% | {ci(r.get('accuracy_ci95'))} | {vs(r.get('accuracy_vs_eagle3'))} "
            f"| {r['think_tokens']:.1f} | {'-' if m == 'eagle3' else _saving(r)} | {r['n']} |"
        )
    return lines


def moves_table(g: dict) -> list[str]:
    """Shifted minus in distribution, per method other than eagle3 (eagle3's own accuracy move shown too)."""
    lines = [
        "| distribution | method | accuracy (points) | vs eagle3 (points) | think tokens | saving vs eagle3 (points) |",
        "|---|---|---|---|---|---|",
    ]
    for name, d in g["distributions"].items():
        for m in ORDER:
            mv = d["methods"].get(m, {}).get("moved_from_in_distribution")
            if mv is None:
                continue
            lines.append(
                f"| {name} | {m} | {_pts(mv['accuracy_points'])} | {_pts(mv['vs_eagle3_points'])} "
                f"| {_pts(mv['think_tokens'])} | {'-' if m == 'eagle3' else _pts(mv['saving_points'], 0)} |"
            )
    return lines


def generalisation_section(g: dict, *, plot: str | None = None) -> list[str]:
    """The Markdown of the section (a list of lines), from a generalisation summary."""
    md = [
        "## Does the exit generalise?",
        "",
        f"The SpecExit exit chosen on the dev split of the training distribution "
        f"(`{json.dumps(g.get('specexit_exit'))}`), evaluated unchanged in distribution and on shifted "
        f"test sets (`specexit_core/toy/shifts.py`), T = {g.get('temperature', 0.0):g}. Intervals: 95% "
        "percentile bootstrap over problems; `vs eagle3` is paired by problem. Saving: 1 - think tokens "
        "/ EAGLE-3's think tokens on the same distribution.",
        "",
    ]
    for name, d in g["distributions"].items():
        md += [f"### {name} ({d['n']} problems)", ""] + distribution_table(d) + [""]
    if g.get("in_distribution") and len(g["distributions"]) > 1:
        md += (
            [
                f"### Moved from {g['in_distribution']}",
                "",
                "Each shifted distribution's value minus the in-distribution one (points; think tokens as "
                "counts). Judge a move against both distributions' intervals above.",
                "",
            ]
            + moves_table(g)
            + [""]
        )
    if plot:
        md += [f"![accuracy vs think tokens per distribution]({plot})", ""]
    return md


def plot_generalisation(g: dict, path: Path) -> None:
    plt = pyplot()
    names = list(g["distributions"])
    cols = min(4, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        d = g["distributions"][name]
        for m in ORDER:
            r = d["methods"].get(m)
            if not r or not r.get("n"):
                continue
            interval = r.get("accuracy_ci95")
            y = 100 * r["accuracy"]
            yerr = None if not interval else [[y - 100 * interval[0]], [100 * interval[1] - y]]
            star = m == "specexit"
            ax.errorbar(
                [r["think_tokens"]],
                [y],
                yerr=yerr,
                fmt="*" if star else "o",
                ms=12 if star else 6,
                color=COLORS.get(m, "#333333"),
                capsize=3,
                label=m,
                zorder=5 if star else 3,
            )
        ax.set_title(f"{name} (n={d['n']})", fontsize=9)
        ax.set_xlabel("think tokens (mean)", fontsize=8)
        ax.set_ylabel("accuracy (%)", fontsize=8)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle("accuracy (95% CI) vs think tokens, one calibrated exit across distributions", fontsize=10)
    save_figure(fig, path, dpi=100)


def write_generalisation_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """report.md (the section) + generalisation.png from `<run_dir>/_generalisation.json`, into `out_dir`
    (default: the run folder's `_report/`)."""
    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir else run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    g = json.loads(meta_path(run_dir, GENERALISATION_FILE).read_text())
    plot_generalisation(g, out / PLOT_FILE)
    md = ["# SpecExit across distributions", ""] + generalisation_section(g, plot=PLOT_FILE)
    path = out / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path
