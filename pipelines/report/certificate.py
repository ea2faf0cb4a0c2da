"""The report's section on the certified exit: the certificate chosen on the dev split against the
loss measured on the evaluation's own problems (`certificate_check` in the evaluation summary:
pipelines/evaluate/certificate_check.py).

- `certificate.png`: per temperature, epsilon (the promise), the certified upper bound found on dev,
  and the loss on the test problems with its 95% interval (problems resampled);
- `certificate_lines(check)`: the same as a Markdown table.
"""

from __future__ import annotations

from pathlib import Path

from pipelines.report.plotting import pyplot, save_figure


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def certificate_lines(check: dict) -> list[str]:
    """A section: what was certified on dev, what the test problems show."""
    rows = [
        "## The certified exit on the test problems",
        "",
        "`specexit calibrate` certified on the dev split that the exit's loss on new prompts is at most "
        "epsilon with probability at least 1 - delta (Learn then Test). These problems are new prompts: the "
        "loss below is measured between `specexit` and `eagle3` on each problem-sample (same seed, so the "
        "same trace until the exit), with a 95% bootstrap interval over problems.",
        "",
        "| T | certificate of | loss | epsilon | delta | certified bound (dev) | test loss [95% CI] | n (problems) | holds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t, c in check.items():
        ci = c.get("test_loss_ci95")
        interval = f"{_pct(c['test_loss'])} [{_pct(ci[0])}, {_pct(ci[1])}]" if ci else _pct(c.get("test_loss"))
        holds = {True: "yes", False: "no", None: "nothing certified"}[c.get("holds")]
        if c.get("holds") is False and c.get("within_epsilon"):
            holds = "point estimate within epsilon, interval not yet"
        rows.append(
            f"| {t} | {c.get('profile') or 'the joint exit'} | {c.get('loss')} | {_pct(c.get('epsilon'))} | "
            f"{c.get('delta')} | {_pct(c.get('bound'))} | {interval} | {c.get('n')} ({c.get('problems')}) | {holds} |"
        )
    return rows + ["", "![certificate](certificate.png)", ""]


def plot_certificate(check: dict, path: Path) -> None:
    """Epsilon, the certified bound and the test loss with its interval, one column per temperature."""
    plt = pyplot()
    temps = list(check)
    fig, ax = plt.subplots(figsize=(max(4.5, 2.2 * len(temps)), 4))
    for i, t in enumerate(temps):
        c = check[t]
        eps = c.get("epsilon")
        if eps is not None:
            ax.hlines(100 * eps, i - 0.35, i + 0.35, colors="#d62728", lw=2, label="epsilon" if i == 0 else None)
        if c.get("bound") is not None:
            ax.plot(i - 0.1, 100 * c["bound"], "s", color="#1f77b4", label="certified bound (dev)" if i == 0 else None)
        if c.get("test_loss") is not None:
            ci = c.get("test_loss_ci95") or [c["test_loss"], c["test_loss"]]
            err = [[100 * (c["test_loss"] - ci[0])], [100 * (ci[1] - c["test_loss"])]]
            ax.errorbar(
                i + 0.1, 100 * c["test_loss"], yerr=err, fmt="o", color="black", capsize=4,
                label="test loss, 95% CI" if i == 0 else None,
            )  # fmt: skip
    ax.set_xticks(range(len(temps)))
    ax.set_xticklabels([f"T={t}\n{check[t].get('profile') or 'joint exit'}" for t in temps], fontsize=8)
    ax.set_ylabel("loss (% of problem-samples)")
    ax.set_xlim(-0.6, len(temps) - 0.4)
    ax.set_ylim(bottom=0)
    ax.set_title("the certified exit: promise, dev bound, test loss")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path)
