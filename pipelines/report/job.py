"""The evaluation report: Markdown + PNG plots from an evaluation output folder.

    python -m pipelines.report RUN_DIR [--out DIR]

(A folder of `python -m pipelines.evaluate.generalisation` gets the "Does the exit generalise?"
report instead: `pipelines/report/generalisation.py`; a `specexit bench longgen --json` result file, the
long-generation report: `pipelines/report/longgen.py`.)

- `pareto.png`: accuracy vs think tokens, one point per method and per budget setting, the Pareto
  front dashed (one panel per temperature);
- `latency.png`: mean end-to-end latency per request at concurrency 1 (probes included);
- `signals.png`: the draft's three signals (EWMA-smoothed as the exit policy sees them, raw faint)
  along a few greedy EAGLE-3 traces, with the SpecExit exit, the oracle exit and the natural end;
- `certificate.png` (a run with a calibrated file): its certified bound against the loss on these
  problems (pipelines/report/certificate.py);
- `report.md`: the tables (per method, the budget sweep, the target checks) and the figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipelines.common.meta_files import REPORT_DIR, SUMMARY_FILE, meta_path
from pipelines.common.run_identity import read_identity
from pipelines.report.plotting import COLORS, ORDER, pyplot, save_figure
from pipelines.report.table_cells import ci, vs


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Non-dominated (think tokens low, accuracy high) points, sorted by think tokens."""
    front, best = [], -1.0
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return front


def _sweep_curve(ax, d: dict, method: str, label: str, *, marker: str, alpha: float, ms: int, label_dy: int) -> list:
    """One sweep (`d["sweeps"][method]`: a budget per point, or an effort level) as a labelled curve;
    returns its (think tokens, accuracy %) points."""
    sweep = [p for p in d["sweeps"].get(method, []) if p.get("n")]
    xs, ys = [p["think_tokens"] for p in sweep], [100 * p["accuracy"] for p in sweep]
    if sweep:
        ax.plot(xs, ys, "-" + marker, color=COLORS[method], alpha=alpha, ms=ms, label=label)
        for p, x, y in zip(sweep, xs, ys):
            ax.annotate(
                str(p["setting"]),
                (x, y),
                fontsize=7,
                color=COLORS[method],
                xytext=(3, label_dy),
                textcoords="offset points",
            )
    return list(zip(xs, ys))


def plot_pareto(by_t: dict, path: Path) -> None:
    plt = pyplot()
    temps = list(by_t)
    fig, axes = plt.subplots(1, len(temps), figsize=(6.5 * len(temps), 4.8), squeeze=False)
    for ax, t in zip(axes[0], temps):
        d = by_t[t]
        pts = []
        pts += _sweep_curve(ax, d, "budget", "budget sweep", marker="o", alpha=0.5, ms=4, label_dy=-9)
        # SpecExit at each reasoning effort level, least thinking first
        pts += _sweep_curve(ax, d, "effort", "reasoning effort", marker="s", alpha=1.0, ms=5, label_dy=4)
        for m in ORDER:
            r = d["methods"].get(m)
            if not r or not r.get("n"):
                continue
            x, y = r["think_tokens"], 100 * r["accuracy"]
            pts.append((x, y))
            star = m == "specexit"  # drawn on top: it often shares its point with another method
            ax.scatter(
                [x],
                [y],
                s=160 if star else 70,
                color=COLORS[m],
                zorder=5 if star else 3,
                marker="*" if star else "o",
                edgecolor="white" if star else None,
                label=m + (f" ({r['setting']})" if m == "budget" else ""),
            )
        front = pareto_front(pts)
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=0.8, alpha=0.6, label="Pareto front")
        ax.set_xlabel("think tokens (mean per problem)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"accuracy vs thinking, T={t}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def plot_latency(by_t: dict, path: Path) -> None:
    plt = pyplot()
    temps = list(by_t)
    methods = [m for m in ORDER if any(by_t[t]["methods"].get(m, {}).get("n") for t in temps)]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(methods) * len(temps)), 4.5))
    w = 0.8 / len(temps)
    for i, t in enumerate(temps):
        ms = by_t[t]["methods"]
        vals = [1000 * (ms.get(m, {}).get("latency_s") or 0.0) for m in methods]
        xs = [j + (i - (len(temps) - 1) / 2) * w for j in range(len(methods))]
        bars = ax.bar(
            xs,
            vals,
            w,
            color=[COLORS[m] for m in methods],
            alpha=1.0 if i == 0 else 0.55,
            edgecolor="black",
            lw=0.5,
            label=f"T={t}",
        )
        e = ms.get("eagle3", {}).get("latency_s")
        for b, m in zip(bars, methods):
            lat = ms.get(m, {}).get("latency_s")
            if e and lat:
                ax.annotate(
                    f"{e / lat:.2f}x",
                    (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center",
                    fontsize=7,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(methods)))
    ax.set_xticklabels(methods)
    ax.set_ylabel("end-to-end latency per request (ms, concurrency 1)")
    ax.set_title("latency (label: speed-up vs eagle3; oracle = its replay only)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path)


def pick_traces(rows: list[dict], k: int = 4) -> list[dict]:
    """Greedy problems with an eagle3 trace (with signals), a specexit and an oracle row; the ones
    with the most overthinking (eagle3 think - oracle think) first."""
    by: dict = {}
    for r in rows:
        if r["status"] == "ok" and float(r["temperature"]) == 0.0:
            by.setdefault(r["problem_id"], {})[r["method"]] = r
    cands = [d for d in by.values() if d.get("eagle3", {}).get("signal_confidence") and "oracle" in d]
    cands.sort(key=lambda d: -(d["eagle3"]["think_tokens"] - d["oracle"]["think_tokens"]))
    return cands[:k]


def plot_signals(rows: list[dict], path: Path, exit_cfg: dict | None, split_ids: set[int] | None = None) -> int:
    from specexit_core.exit import ExitConfig, ewma

    plt = pyplot()
    ec = ExitConfig.from_dict(exit_cfg or {})
    traces = pick_traces(rows)
    if not traces:
        return 0
    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 2.8 * len(traces)), squeeze=False)
    for ax, d in zip(axes[:, 0], traces):
        e = d["eagle3"]
        n = e["think_tokens"]
        conf, prog, rem = (list(e[f"signal_{s}"])[:n] for s in ("confidence", "progress", "remaining"))
        xs = list(range(n))
        for ys, c, lab in ((conf, "#d62728", "confidence"), (prog, "#1f77b4", "progress")):
            ax.plot(xs, ys, color=c, alpha=0.25, lw=0.8)
            ax.plot(xs, ewma(ys, ec.alpha), color=c, lw=1.6, label=f"{lab} (EWMA a={ec.alpha:g})")
        ax.axhline(ec.confidence_threshold, color="#d62728", ls=":", lw=0.8)
        ax.axhline(ec.progress_threshold, color="#1f77b4", ls=":", lw=0.8)
        ax.set_ylim(-0.02, 1.05)
        ax2 = ax.twinx()
        ax2.plot(xs, ewma(rem, ec.alpha), color="#2ca02c", lw=1.4, label="remaining (EWMA, right)")
        ax2.plot(xs, rem, color="#2ca02c", alpha=0.25, lw=0.8)
        ax2.set_ylabel("remaining tokens", fontsize=8)
        comp = e["completion_token_ids"]
        if split_ids:
            for t in range(n):
                if comp[t] in split_ids:
                    ax.axvline(t, color="grey", lw=0.3, alpha=0.5)
        marks = [("oracle exit", d["oracle"]["think_tokens"], "black", "--"), ("natural end", n, "grey", "-")]
        if "specexit" in d:
            marks.insert(0, ("SpecExit exit", d["specexit"]["think_tokens"], "#d62728", "-"))
        for lab, x, c, ls in marks:
            ax.axvline(x, color=c, ls=ls, lw=1.8, label=f"{lab} @{x}")
        ax.set_title(f"{(e.get('prompt') or d['eagle3']['problem_id'])[:80]}", fontsize=9)
        ax.set_xlabel("think token")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=6, loc="center right")
    save_figure(fig, path, dpi=100)
    return len(traces)


def _fmt(x, nd=3):
    if x is None:
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _speedup(r: dict, ratio: float | None) -> str:
    """The speed-up vs eagle3, with its paired 95% interval over the timed problems when recorded."""
    sp = r.get("speedup_vs_eagle3")
    return _fmt(ratio, 2) + (f" {ci(sp['ci95'], 1.0, 2)}" if ratio is not None and sp else "")


def method_table(d: dict) -> list[str]:
    e = d["methods"].get("eagle3", {}).get("latency_s")
    lines = [
        "| method | accuracy | 95% CI | vs eagle3 (points, 95% CI) | think tokens | answer tokens | latency (ms) "
        "| speed-up vs eagle3 | acceptance length | probe requests | requests | n |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in ORDER:
        r = d["methods"].get(m)
        if not r or not r.get("n"):
            continue
        name = f"{m} ({r['setting']}, chosen on {r.get('chosen_on', 'this run')})" if m == "budget" else m
        lat = r.get("latency_s")
        lines.append(
            f"| {name} | {100 * r['accuracy']:.1f}% | {ci(r.get('accuracy_ci95'))} | {vs(r.get('accuracy_vs_eagle3'))} "
            f"| {r['think_tokens']:.1f} | {r['answer_tokens']:.1f} | {_fmt(None if lat is None else 1000 * lat, 1)} | "
            f"{_speedup(r, e / lat if e and lat else None)} | "
            f"{_fmt(r.get('acceptance_length'), 2)} | {r['probe_requests']:.2f} | {r['requests']:.2f} | {r['n']} |"
        )
    return lines


def effort_table(levels: list[dict], eagle3_latency: float | None) -> list[str]:
    """SpecExit at each reasoning effort level (its certified exit): a row per level."""
    lines = [
        "By reasoning effort (SpecExit at each level's certified exit; `max`: no early exit):",
        "",
        "| effort | accuracy | 95% CI | vs eagle3 (points, 95% CI) | think tokens | latency (ms) | speed-up vs eagle3 | n |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in levels:
        lat = p.get("latency_s")
        lines.append(
            f"| {p['setting']} | {100 * p['accuracy']:.1f}% | {ci(p.get('accuracy_ci95'))} | "
            f"{vs(p.get('accuracy_vs_eagle3'))} | {p['think_tokens']:.1f} | {_fmt(None if lat is None else 1000 * lat, 1)} | "
            f"{_speedup(p, eagle3_latency / lat if eagle3_latency and lat else None)} | {p['n']} |"
        )
    return lines


def within_table(by_t: dict, points: float = 1.0) -> list[str]:
    """Which methods are within `points` of eagle3's accuracy at 95% confidence (the lower end of
    the paired bootstrap interval of method - eagle3 above -points)."""
    lines = [
        f"| T | method | vs eagle3 (points) | 95% CI | within {points:g} point of eagle3 at 95% |",
        "|---|---|---|---|---|",
    ]
    for t, d in by_t.items():
        for m in ORDER:
            diff = d["methods"].get(m, {}).get("accuracy_vs_eagle3")
            if diff:
                held = diff["ci95"][0] >= -points - 1e-9
                lines.append(
                    f"| {t} | {m} | {diff['points']:+.1f} | {ci(diff['ci95'], 1.0)} | {'yes' if held else 'no'} |"
                )
    return lines


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Writes report.md, pareto.png, latency.png, signals.png; returns the report path."""
    from pipelines.common.parts import read_all

    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir else run_dir / REPORT_DIR  # not among the run's Parquet: meta_files.py
    out.mkdir(parents=True, exist_ok=True)
    s = json.loads(meta_path(run_dir, SUMMARY_FILE).read_text())
    by_t = s["by_temperature"]
    plot_pareto(by_t, out / "pareto.png")
    plot_latency(by_t, out / "latency.png")
    rows = read_all(
        run_dir,
        [
            "problem_id",
            "status",
            "method",
            "temperature",
            "think_tokens",
            "prompt",
            "completion_token_ids",
            "signal_confidence",
            "signal_progress",
            "signal_remaining",
        ],
    ).to_pylist()
    split = _split_ids(run_dir)
    n_sig = plot_signals(rows, out / "signals.png", s.get("specexit_exit"), split)
    md = [
        "# SpecExit vs peer methods",
        "",
        f"{s['n']} problems ({s['ok']} ok, {s['errors']} with errors), temperatures "
        f"{', '.join(by_t)}; one engine (EAGLE-3 + SpecExit draft) for every method but `plain`; latency = "
        f"end-to-end per request at concurrency 1, probes included (oracle: its replay only, probing "
        f"listed separately), timed on the first `latency_problems` problems (`latency_n` per method). SpecExit exit setting: `{json.dumps(s.get('specexit_exit'))}` (null = the draft's defaults).",
        "",
    ]
    if s.get("peer_settings"):
        md += [f"Peer settings: `{json.dumps(s['peer_settings'])}`.", ""]
    for t, d in by_t.items():
        md += [f"## T = {t}", ""] + method_table(d) + [""]
        sweep = d["sweeps"].get("budget", [])
        if sweep:
            md += [
                "Static budget sweep:",
                "",
                "| budget | accuracy | vs eagle3 (points, 95% CI) | think tokens | latency (ms) |",
                "|---|---|---|---|---|",
            ]
            md += [
                f"| {p['setting']} | {100 * p['accuracy']:.1f}% | {vs(p.get('accuracy_vs_eagle3'))} | "
                f"{p['think_tokens']:.1f} | {_fmt(None if p.get('latency_s') is None else 1000 * p['latency_s'], 1)} |"
                for p in sweep
                if p.get("n")
            ] + [""]
        levels = [p for p in d["sweeps"].get("effort", []) if p.get("n")]
        if levels:
            md += effort_table(levels, d["methods"].get("eagle3", {}).get("latency_s")) + [""]
        o = d["methods"].get("oracle", {})
        if o.get("probe_latency_s") is not None:
            md += [
                f"Oracle probing (not in its latency): {o['probe_requests']:.1f} probes, "
                f"{1000 * o['probe_latency_s']:.1f} ms per problem.",
                "",
            ]
    md += (
        [
            "## Accuracy against EAGLE-3, paired by problem",
            "",
            "Each interval is a 95% percentile bootstrap over problems (2,000 resamples, seeded), of the "
            "method's accuracy minus EAGLE-3's on the same problems.",
            "",
        ]
        + within_table(by_t)
        + [""]
    )
    if s.get("certificate_check"):  # run with a calibrated file: does its certificate hold here?
        from pipelines.report.certificate import certificate_lines, plot_certificate

        plot_certificate(s["certificate_check"], out / "certificate.png")
        md += certificate_lines(s["certificate_check"])
    md += ["## Targets", "", "| T | target | value | required | result |", "|---|---|---|---|---|"]
    for t, checks in s.get("targets", {}).items():
        for name, c in checks.items():
            res = "pass" if c["pass"] else f"miss: {c['miss_by']}"
            md.append(f"| {t} | {name} | {json.dumps(c['value'])} | {c['target']} | {res} |")
    md += ["", "## Figures", "", "![accuracy vs think tokens](pareto.png)", "", "![latency](latency.png)", ""]
    if n_sig:
        md += [
            f"Signals along {n_sig} greedy traces (vertical lines: SpecExit exit, oracle exit, natural end; "
            "thin grey: paragraph breaks; dotted: thresholds):",
            "",
            "![signals](signals.png)",
            "",
        ]
    path = out / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path


def _split_ids(run_dir: Path) -> set[int] | None:
    """The draft's paragraph-break ids (thin lines in the signal plot); None if unknown."""
    from specexit_core.draft.checkpoint import read_config

    try:
        ident = read_identity(run_dir)
        draft = ident["config"]["draft"] if "config" in ident else ident["draft"]  # an identity before #16: flat
        return set(read_config(draft).token_ids["split"])
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.report", description="report of an evaluation run")
    ap.add_argument("run_dir", help="evaluation (or generalisation) folder, or a bench longgen JSON file")
    ap.add_argument("--out", help="output folder (default: the run folder's _report/)")
    a = ap.parse_args(argv)
    from pipelines.common.meta_files import GENERALISATION_FILE
    from pipelines.report.generalisation import write_generalisation_report

    if Path(a.run_dir).is_file():  # a `specexit bench longgen --json` result: pipelines/report/longgen.py
        from pipelines.report.longgen import write_longgen_report

        print(write_longgen_report(a.run_dir, a.out))
        return 0
    if meta_path(a.run_dir, GENERALISATION_FILE).exists():  # a generalisation run: one evaluation per distribution
        print(write_generalisation_report(a.run_dir, a.out))
        return 0
    print(write_report(a.run_dir, a.out))
    return 0
