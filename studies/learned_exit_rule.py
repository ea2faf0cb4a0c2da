"""Does a learned exit rule move the front past the paper's AND of thresholds? (#44 item 4)

    python studies/learned_exit_rule.py DEV_DIR DRAFT CALIBRATE_YAML --out OUT.json [--splits 20]

DEV_DIR is a finished calibration dev run (EAGLE-3 traces with per-token draft signals and the
oracle's forced answer at every paragraph break, greedy and sampled). The candidate rule is a
logistic score of what the engine's tracker has at a break, the smoothed confidence, progress and
log1p(remaining) (one EWMA weight, `--alphas` for several) and log1p(think tokens so far), fitted to
"the answer forced here equals the one the trace reaches at its natural end" (no gold: the
disagreement loss the certified exit uses); it exits at the first break whose score passes tau.

Both families choose on one random half of the dev prompts, the same way calibration's tolerance
rule does (the fewest think tokens with a disagreement rate <= tol there: over the recipe's whole
grid for the paper's rule, over tau for the learned one, fitted on that half), and are judged on the
other half: disagreement, accuracy against EAGLE-3 and mean think tokens, averaged over `--splits`
halvings, beside the oracle and EAGLE-3 on the same halves. A rule that moves the front thinks less
at the same held-out loss.
"""

from __future__ import annotations

import argparse
import json
import math
import random

import numpy as np

from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import draft_token_ids, exit_result, grid, load_traces, replay_outcomes, trace_checks
from pipelines.calibrate.signal_quality import oracle_outcome
from pipelines.common.provenance import provenance
from specexit_core.typed_config import load_config


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iters: int = 30):
    """Ridge-penalised logistic regression by Newton steps on standardised features; returns the score
    function (the logit) of a feature matrix."""
    mu, sd = x.mean(0), x.std(0) + 1e-9
    xs = np.c_[np.ones(len(x)), (x - mu) / sd]
    w = np.zeros(xs.shape[1])
    pen = l2 * np.diag(np.r_[0.0, np.ones(len(w) - 1)])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-xs @ w))
        w -= np.linalg.solve((xs * (p * (1 - p))[:, None]).T @ xs + pen, xs.T @ (p - y) + pen @ w)
    return lambda f: w[0] + ((f - mu) / sd) @ w[1:]


def break_table(trace: dict, alphas: list[float], ids: dict) -> tuple[np.ndarray, list, list[bool]]:
    """Per break of one trace: its features, its outcome (exit there; the last entry: no exit) and
    whether the oracle probed it."""
    by_alpha = [trace_checks(trace, a, ids) for a in alphas]
    rows = []
    for k, check in enumerate(by_alpha[0]):
        f = []
        for checks in by_alpha:
            s = checks[k].smoothed
            f += [s["confidence"], s["progress"], math.log1p(max(s["remaining"], 0.0))]
        rows.append([*f, math.log1p(check.think_tokens)])
    feats = np.array(rows, float).reshape(len(rows), 3 * len(alphas) + 1)
    outs = [exit_result(trace, c) for c in by_alpha[0]] + [exit_result(trace, None)]
    return feats, outs, [trace["probes"].get(c.index) is not None for c in by_alpha[0]]


def first_pass(scores: np.ndarray, outcomes: list, tau: float) -> tuple:
    """The outcome of the first break whose score passes tau (the last entry of `outcomes`: no exit)."""
    hit = np.flatnonzero(scores > tau)
    return outcomes[hit[0] if hit.size else -1]


def summary(rows: list[tuple[float, float, float]]) -> dict:
    a = np.array(rows)
    return {
        "disagreement": round(float(a[:, 0].mean()), 5),
        "accuracy_vs_eagle3_points": round(100 * float(a[:, 1].mean()), 3),
        "think_tokens": round(float(a[:, 2].mean()), 2),
    }


def study(dev: str, draft: str, config: str, *, splits: int, tolerances: list[float], alphas: list[float]) -> dict:
    ids = draft_token_ids(draft)
    cfg = load_config(CalibrateConfig, config, what="calibrate")
    settings = grid(cfg)
    out: dict = {"grid": len(settings), "by_temperature": {}}
    for temp in cfg.temperatures:
        traces = load_traces(dev, temp)
        n = len(traces)

        def disagree(i: int, res: tuple) -> float:
            return float(res[2] != traces[i]["final_answer"])  # noqa: B023 (used in this iteration only)

        paper = replay_outcomes(traces, settings, ids, exit_result)
        loss = np.array([[disagree(i, r) for i, r in enumerate(row)] for row in paper])
        think = np.array([[r[1] for r in row] for row in paper], float)
        acc = np.array([[r[0] for r in row] for row in paper], float)
        tables = [break_table(tr, alphas, ids) for tr in traces]
        oracle = np.array([oracle_outcome(tr, ids) for tr in traces], float)
        e3 = np.array([[tr["correct"], tr["think_tokens"]] for tr in traces], float)
        rng = random.Random(0)
        res: dict[str, list] = {}
        for _ in range(splits):
            idx = list(range(n))
            rng.shuffle(idx)
            a, b = np.array(idx[: n // 2]), np.array(idx[n // 2 :])
            e3b = e3[b, 0].mean()
            for tol in tolerances:
                ok = np.flatnonzero(loss[:, a].mean(1) <= tol)
                s = ok[np.argmin(think[ok][:, a].mean(1))]
                res.setdefault(f"paper@{tol:g}", []).append(
                    (loss[s, b].mean(), acc[s, b].mean() - e3b, think[s, b].mean())
                )
            x = [t[0][k] for i in a for t in [tables[i]] for k in range(len(t[0])) if t[2][k]]
            y = [1.0 - disagree(i, t[1][k]) for i in a for t in [tables[i]] for k in range(len(t[0])) if t[2][k]]
            score = fit_logistic(np.array(x), np.array(y))
            scores = [score(t[0]) if len(t[0]) else np.zeros(0) for t in tables]

            def outcome(i: int, tau: float, scores=scores, tables=tables) -> tuple:
                return first_pass(scores[i], tables[i][1], tau)

            taus = np.unique(np.quantile(np.concatenate([scores[i] for i in a]), np.linspace(0, 1, 80)))
            for tol in tolerances:
                best = None
                for tau in taus:
                    o = [outcome(i, tau) for i in a]
                    if np.mean([disagree(i, r) for i, r in zip(a, o)]) <= tol:
                        th = np.mean([r[1] for r in o])
                        if best is None or th < best[1]:
                            best = (tau, th)
                tau = best[0] if best else math.inf
                o = [outcome(i, tau) for i in b]
                res.setdefault(f"learned@{tol:g}", []).append(
                    (
                        np.mean([disagree(i, r) for i, r in zip(b, o)]),
                        np.mean([r[0] for r in o]) - e3b,
                        np.mean([r[1] for r in o]),
                    )
                )
            res.setdefault("oracle", []).append((0.0, oracle[b, 0].mean() - e3b, oracle[b, 1].mean()))
            res.setdefault("eagle3", []).append((0.0, 0.0, e3[b, 1].mean()))
        out["by_temperature"][f"{temp:g}"] = {"traces": n, **{k: summary(v) for k, v in res.items()}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dev_dir")
    ap.add_argument("draft")
    ap.add_argument("config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--tolerances", default="0.01,0.02")
    ap.add_argument("--alphas", default="0.1", help="EWMA weights whose smoothed signals feed the score")
    a = ap.parse_args()
    res = study(
        a.dev_dir,
        a.draft,
        a.config,
        splits=a.splits,
        tolerances=[float(x) for x in a.tolerances.split(",")],
        alphas=[float(x) for x in a.alphas.split(",")],
    )
    res.update(
        dev_dir=a.dev_dir, draft=a.draft, config=a.config, splits=a.splits, alphas=a.alphas, provenance=provenance()
    )
    for t, d in res["by_temperature"].items():
        for k, v in d.items():
            if k != "traces":
                print(f"T={t} {k:14s} {json.dumps(v)}")
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
