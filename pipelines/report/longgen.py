"""The long-generation report: Markdown + two PNG plots from the JSON of `specexit bench longgen --json` (its last
line, `{"rows": [...], ...}`, saved to a file, e.g. docs/results/longgen_bench_toy.json).

    python -m pipelines.report ROWS.json [--out DIR]      (or python -m pipelines.report.longgen)

- `longgen_speedup.png`: wall-time speed-up over the plain decoding of the method's own backend vs generated
  length, one panel per temperature, solid = penalty off, dashed = penalty on;
- `longgen_acceptance.png`: acceptance (accepted / drafted positions) vs length, same layout;
- `report.md`: the rows as a table, the issue's targets, the figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipelines.report.plotting import pyplot, save_figure

SPEEDUP_PLOT = "longgen_speedup.png"
ACCEPTANCE_PLOT = "longgen_acceptance.png"
DRAFTING = ("tokenswift", "eagle3", "vllm_long")  # methods with drafts (plain has neither ratio nor acceptance)
COLORS = {"tokenswift": "#d62728", "eagle3": "#1f77b4", "vllm_long": "#2ca02c", "plain": "#7f7f7f"}


def read_rows(path: str | Path) -> dict:
    """The bench's JSON document: a file holding the object, or the bench's whole stdout (its last line)."""
    text = Path(path).read_text().strip()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = json.loads(text.splitlines()[-1])
    if not isinstance(doc, dict) or "rows" not in doc:
        raise ValueError(f"{path}: not a `specexit bench longgen --json` result (no 'rows')")
    return doc


def series(rows: list[dict], key: str) -> dict[tuple[float, str, str], list[tuple[int, float]]]:
    """{(temperature, penalty, method): [(length, value), ...] sorted by length} for the drafting methods."""
    out: dict[tuple[float, str, str], list[tuple[int, float]]] = {}
    for r in rows:
        if r["method"] in DRAFTING and r.get(key) is not None:
            out.setdefault((r["temperature"], r["penalty"], r["method"]), []).append((r["length"], r[key]))
    return {k: sorted(v) for k, v in out.items()}


def plot_vs_length(rows: list[dict], key: str, path: Path, ylabel: str, title: str, ref: float | None = None) -> None:
    plt = pyplot()
    data = series(rows, key)
    temps = sorted({t for t, _, _ in data}) or [0.0]
    fig, axes = plt.subplots(1, len(temps), figsize=(5.6 * len(temps), 4.2), squeeze=False)
    for ax, t in zip(axes[0], temps):
        for (tt, pen, m), pts in sorted(data.items()):
            if tt != t:
                continue
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                "-o" if pen == "off" else "--s",
                color=COLORS.get(m, "#333333"),
                ms=5,
                label=f"{m}, penalty {pen}",
            )
        if ref is not None:
            ax.axhline(ref, color="black", lw=0.8, alpha=0.6)
        ax.set_xscale("log", base=2)
        lengths = sorted({p[0] for (tt, _, _), pts in data.items() if tt == t for p in pts})
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("generated tokens")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}, {'greedy' if t == 0 else f'T = {t:g}'}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    save_figure(fig, path, dpi=100)


def _f(x, nd: int = 2, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.{nd}f}{suffix}"


def rows_table(rows: list[dict]) -> list[str]:
    lines = [
        "| length | T | penalty | method | backend | wall s | speed-up vs plain | vs eagle3 | tok/fwd | acceptance "
        "| Distinct-n | drafter KV | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        same = {True: "yes", False: "**no**", None: "-"}[r.get("identical_to_plain")]
        lines.append(
            f"| {r['length']} | {r['temperature']:g} | {r['penalty']} | {r['method']} | {r.get('backend', '-')} "
            f"| {r['wall_s']:.2f} | {_f(r.get('speedup_vs_plain'), 2, 'x')} | {_f(r.get('speedup_vs_eagle3'), 2, 'x')} "
            f"| {r['tokens_per_forward']:.2f} | {_f(r.get('acceptance'))} | {r['distinct_n']:.2f} "
            f"| {r.get('drafter_kv_positions', '-')} | {same} |"
        )
    return lines


def longgen_section(doc: dict, *, plots: tuple[str, str] | None = (SPEEDUP_PLOT, ACCEPTANCE_PLOT)) -> list[str]:
    ms = doc.get("model_set") or {}
    md = [
        "## Long generation",
        "",
        f"Model set `{ms.get('name', '?')}`; speed-up = wall time of the plain decoding of the same backend "
        "(torch for the TokenSwift engine, vLLM without speculative decoding for the vLLM methods) / the method's; "
        "`vs eagle3`: the long mode against EAGLE-3 alone on the same engine. Provenance: "
        f"`{doc.get('command', '?')}` at {doc.get('commit', '?')}, {doc.get('date', '?')}, {doc.get('machine', '?')}.",
        "",
        *rows_table(doc["rows"]),
        "",
    ]
    for m, why in (doc.get("skipped") or {}).items():
        md.append(f"- {m}: skipped ({why})")
    if doc.get("targets"):
        md += ["", "| target | value | at length | required | pass |", "|---|---|---|---|---|"]
        for name, t in doc["targets"].items():
            ok = {True: "yes", False: "no", None: "not measurable here"}[t.get("pass")]
            md.append(f"| {name} | {_f(t.get('value'))} | {t.get('at_length')} | {t.get('required')} | {ok} |")
    if plots:
        md += ["", f"![speed-up vs length]({plots[0]})", "", f"![acceptance vs length]({plots[1]})", ""]
    return md


def write_longgen_report(rows_json: str | Path, out_dir: str | Path | None = None) -> Path:
    """report.md + the two plots from a `specexit bench longgen --json` result file."""
    doc = read_rows(rows_json)
    out = Path(out_dir or Path(rows_json).with_suffix(""))  # default: a folder named after the file
    out.mkdir(parents=True, exist_ok=True)
    plot_vs_length(doc["rows"], "speedup_vs_plain", out / SPEEDUP_PLOT, "speed-up vs plain (wall)", "speed-up", 1.0)
    plot_vs_length(doc["rows"], "acceptance", out / ACCEPTANCE_PLOT, "accepted / drafted", "acceptance")
    path = out / "report.md"
    path.write_text("\n".join(["# Long generation", "", *longgen_section(doc)[2:]]) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.report.longgen", description="long-generation report")
    ap.add_argument("rows_json", help="the JSON of `specexit bench longgen --json` (or its whole stdout)")
    ap.add_argument("--out", help="output folder (default: the file's path without .json)")
    a = ap.parse_args(argv)
    print(write_longgen_report(a.rows_json, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
