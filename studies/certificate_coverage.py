"""Does the certified exit's guarantee hold? Empirical coverage over random calibration sets (issue #39 item 5).

    python studies/certificate_coverage.py [--problems 600] [--temperature 0.6] [--subset 100] [--splits 100]
        [--epsilon 0.05] [--delta 0.1] [--workdir runs/certificate_coverage] [--out F.json] [--png F.png]

A pool of toy problems (a fresh draw of the dev distribution) is traced once with EAGLE-3 at the
temperature, every paragraph break probed (the calibration's own dev run: pipelines/calibrate/job.py),
and every setting of the calibration grid replayed over the whole pool: its disagreement loss per
problem (the answer forced at the exit differs from the one the trace reaches at its natural end). The
pool stands in for the prompt distribution. Then, `--splits` times, a random calibration set of
`--subset` problems chooses an exit the way `specexit calibrate` does (`selection: certified`: Learn
then Test on that set alone) and the chosen setting's loss is measured on the whole pool. The
certificate promises P(loss > epsilon) <= delta, so the share of splits whose pool loss exceeds epsilon
must be at most delta (`coverage` >= 1 - delta). Beside it, the point-estimate rule on the same sets
(the fewest think tokens whose loss *on the set* is <= epsilon) shows what the certificate prevents.

Writes the raw JSON (every split: the certified bound, the pool loss, think tokens) and a PNG of the
certified bound against the pool loss. The evaluation run resumes when the pool folder exists.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from pipelines.calibrate.certificate import prompt_losses
from pipelines.calibrate.config import load_calibrate_config
from pipelines.calibrate.job import draft_token_ids, exit_result, grid, load_traces, replay_outcomes
from pipelines.common.provenance import emit_result, provenance
from specexit_core.exit.risk_control import certify


def pool_run(args) -> tuple:
    """The pool's traces at the temperature (evaluating first if needed), the grid, the per-setting
    per-problem losses and think tokens."""
    from pipelines.common.runtime import stop_ray_quietly
    from pipelines.evaluate.job import run_evaluation

    cfg = load_calibrate_config(args.config)
    ev = cfg.eval.model_copy(
        update={
            "input": cfg.eval.input.model_copy(update={"kind": "toy", "split": "dev", "n": args.problems, "seed": 1}),
            "methods": ["eagle3", "oracle"],
            "temperatures": [args.temperature],
            "signals": True,
            "calibrated": None,
            "peer_probes": False,
            "latency_problems": 0,
            "limit": None,
            "output": str(Path(args.workdir) / "pool"),
        }
    )
    run_evaluation(ev)
    stop_ray_quietly()
    traces = load_traces(ev.output, args.temperature)
    settings = grid(cfg)
    cache = Path(args.workdir) / f"replay_T{args.temperature:g}.npz"
    ids = [tr["id"] for tr in traces]
    if cache.exists():  # the replay of this pool over this grid, saved by an earlier run
        import numpy as np

        z = np.load(cache, allow_pickle=False)
        if list(z["ids"]) == ids and z["loss"].shape[0] == len(settings):
            loss_rows = [dict(zip(ids, row.tolist())) for row in z["loss"].astype(float)]
            think_rows = [dict(zip(ids, row.tolist())) for row in z["think"].astype(int)]
            return traces, settings, loss_rows, think_rows
    results = replay_outcomes(traces, settings, draft_token_ids(ev.draft), exit_result)
    losses = prompt_losses({args.temperature: traces}, {args.temperature: results}, "disagreement")
    label = next(iter(losses))
    think = [{tr["id"]: r[1] for tr, r in zip(traces, row)} for row in results]
    import numpy as np

    np.savez_compressed(
        cache,
        ids=np.array(ids),
        loss=np.array([[row[i] for i in ids] for row in losses[label]], np.uint8),
        think=np.array([[row[i] for i in ids] for row in think], np.int16),
    )
    return traces, settings, losses[label], think


def study(traces, settings, losses, think, args) -> dict:
    ids = [tr["id"] for tr in traces]
    pool_loss = [statistics.mean(row.values()) for row in losses]
    pool_think = [statistics.mean(row.values()) for row in think]
    eagle_think = statistics.mean(tr["think_tokens"] for tr in traces)
    rng = random.Random(args.seed)
    splits = []
    for s in range(args.splits):
        sub = rng.sample(ids, args.subset)
        sub_losses = {"T": [{i: row[i] for i in sub} for row in losses]}
        cost = [statistics.mean(row[i] for i in sub) for row in think]
        cert = certify(sub_losses, cost, epsilon=args.epsilon, delta=args.delta, order_share=0.5, seed=s)
        alt = certify(sub_losses, cost, epsilon=args.epsilon, delta=args.delta, order_share=0.5, seed=s, order="loss")
        # the point-estimate rule on the same set: fewest think tokens with loss on the set <= epsilon
        ok = [k for k in range(len(settings)) if statistics.mean(sub_losses["T"][k].values()) <= args.epsilon]
        point = min(ok, key=lambda k: (cost[k], k)) if ok else None
        c = cert.chosen
        splits.append(
            {
                "certified": None if c is None else settings[c].to_dict(),
                "bound": cert.bound,
                "pool_loss": 0.0 if c is None else pool_loss[c],  # no setting certified: the exit stays off
                "pool_think_tokens": eagle_think if c is None else pool_think[c],
                "loss_order_bound": alt.bound,
                "loss_order_pool_loss": 0.0 if alt.chosen is None else pool_loss[alt.chosen],
                "loss_order_pool_think_tokens": eagle_think if alt.chosen is None else pool_think[alt.chosen],
                "point_pool_loss": 0.0 if point is None else pool_loss[point],
                "point_pool_think_tokens": eagle_think if point is None else pool_think[point],
            }
        )
    exceed = [sp["pool_loss"] > args.epsilon for sp in splits]
    point_exceed = [sp["point_pool_loss"] > args.epsilon for sp in splits]
    certified = [sp for sp in splits if sp["certified"] is not None]
    return {
        "what": "empirical coverage of the certified exit: random calibration sets choose by Learn then Test, "
        "the chosen setting's disagreement loss is measured on the whole pool (the stand-in for the prompt "
        "distribution)",
        "teacher": "toy",
        "temperature": args.temperature,
        "pool_problems": len(ids),
        "subset": args.subset,
        "splits": args.splits,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "grid_size": len(settings),
        "coverage": 1 - statistics.mean(exceed),
        "target_coverage": 1 - args.delta,
        "holds": 1 - statistics.mean(exceed) >= 1 - args.delta,
        "certified_share": len(certified) / len(splits),
        "mean_pool_loss_certified": statistics.mean(sp["pool_loss"] for sp in splits),
        "mean_think_tokens_certified": statistics.mean(sp["pool_think_tokens"] for sp in splits),
        # the same test along every setting by estimated loss (ties: dearest first) instead of the Pareto
        # front (specexit_core/exit/risk_control.py `loss_order`)
        "loss_order": {
            "coverage": 1 - statistics.mean(sp["loss_order_pool_loss"] > args.epsilon for sp in splits),
            "certified_share": statistics.mean(sp["loss_order_bound"] is not None for sp in splits),
            "mean_pool_loss": statistics.mean(sp["loss_order_pool_loss"] for sp in splits),
            "mean_think_tokens": statistics.mean(sp["loss_order_pool_think_tokens"] for sp in splits),
        },
        "point_estimate": {
            "exceed_share": statistics.mean(point_exceed),
            "mean_pool_loss": statistics.mean(sp["point_pool_loss"] for sp in splits),
            "mean_think_tokens": statistics.mean(sp["point_pool_think_tokens"] for sp in splits),
        },
        "pool": {
            "eagle3_think_tokens": eagle_think,
            "oracle_think_tokens": statistics.mean(tr["oracle_think"] for tr in traces),
            # the cheapest setting whose loss over the whole pool is <= epsilon: what a perfect choice gets
            "best_within_epsilon_think_tokens": min(
                (t for t, lo in zip(pool_think, pool_loss) if lo <= args.epsilon), default=eagle_think
            ),
        },
        "by_split": splits,
    }


def plot(res: dict, png: Path) -> None:
    """Left: each split's certified bound (from its calibration set) against the chosen exit's loss on
    the whole pool; right: the pool loss of both rules' choices over the splits, epsilon marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps, splits = res["epsilon"], res["by_split"]
    rng = random.Random(0)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.4), gridspec_kw={"width_ratios": [1.2, 1]})
    cert = [sp for sp in splits if sp["bound"] is not None]
    top = max([eps * 2] + [sp["pool_loss"] for sp in splits] + [sp["point_pool_loss"] for sp in splits]) * 1.05
    a.scatter(
        [sp["bound"] * (1 + rng.uniform(-0.01, 0.01)) for sp in cert],
        [sp["pool_loss"] for sp in cert],
        s=12,
        alpha=0.5,
    )
    a.plot([0, top], [0, top], color="grey", lw=0.8, ls=":", label="pool loss = bound")
    a.axhline(eps, color="black", lw=0.8, ls="--", label=f"epsilon = {eps:g}")
    a.set_xlim(0, top)
    a.set_ylim(-top * 0.02, top)
    a.set_xlabel("certified upper bound (calibration set)")
    a.set_ylabel("disagreement loss on the whole pool")
    a.set_title(f"{len(cert)} of {len(splits)} sets certified a setting", fontsize=9)
    a.legend(fontsize=8, loc="upper left")
    for x, key, color in ((0, "pool_loss", "tab:blue"), (1, "point_pool_loss", "tab:red")):
        ys = [sp[key] for sp in splits]
        b.scatter([x + rng.uniform(-0.15, 0.15) for _ in ys], ys, s=10, alpha=0.4, color=color)
        share = sum(y > eps for y in ys) / len(ys)
        b.text(x, top * 0.97, f"{share:.1%} above epsilon", ha="center", va="top", fontsize=8)
    b.axhline(eps, color="black", lw=0.8, ls="--")
    b.set_xticks([0, 1], ["certified\n(Learn then Test)", "point estimate\n<= epsilon on the set"], fontsize=8)
    b.set_ylim(-top * 0.02, top)
    b.set_title(f"coverage {res['coverage']:.3f} (target >= {res['target_coverage']:.2f})", fontsize=9)
    fig.suptitle(
        f"toy, T = {res['temperature']:g}: {res['splits']} random calibration sets of {res['subset']} problems "
        f"from a pool of {res['pool_problems']}, delta = {res['delta']:g}",
        fontsize=10,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config", default="examples/toy/calibrate.yaml", help="the calibration recipe (grid, engine, draft)"
    )
    p.add_argument("--problems", type=int, default=600)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--subset", type=int, default=100, help="calibration set size")
    p.add_argument("--splits", type=int, default=100)
    p.add_argument("--epsilon", type=float, default=0.05)
    p.add_argument("--delta", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="runs/certificate_coverage")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--png", help="the plot (default: beside --out, else in --workdir)")
    p.add_argument("--replot", metavar="JSON", help="only redraw the plot of a saved result")
    args = p.parse_args(argv)
    if args.replot:
        res = json.loads(Path(args.replot).read_text())
        plot(res, Path(args.png or Path(args.replot).with_suffix(".png")))
        return 0
    if not 0 < args.subset < args.problems:
        p.error("--subset must be between 0 and --problems")
    traces, settings, losses, think = pool_run(args)
    res = {**study(traces, settings, losses, think, args), **provenance()}
    png = Path(args.png or (Path(args.out).with_suffix(".png") if args.out else Path(args.workdir) / "coverage.png"))
    plot(res, png)
    res["png"] = str(png)
    emit_result(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
