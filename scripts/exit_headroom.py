"""How far any exit of the calibration grid could go on a demo run's test split: the headroom behind a
missed think-token or speed-up target.

    python scripts/exit_headroom.py WORKDIR TEACHER [--out F.json]

WORKDIR is a finished `specexit demo --teacher TEACHER --json --workdir WORKDIR` run. The exit decision
depends only on a trace's tokens and draft signals, and its accuracy on the forced answer probed at
that break, so the calibration's offline replay (pipelines/calibrate/job.py) applies to the test
split's EAGLE-3 traces as well as to the dev split's. For every setting of the recipe's grid, at each
calibration temperature, this replays the test traces and reports:

* `calibrated`: the setting the run chose on dev, replayed on test (it should equal the evaluation's
  own specexit figures, a check of the replay);
* `best_on_test`: the setting the same rule would choose *on the test split itself* (fewest think
  tokens with accuracy within tolerance of EAGLE-3's at every temperature): not a fair result, an
  upper bound. When even it thinks more than 1.3x the oracle's tokens, no exit of this family,
  driven by this run's draft signals, can meet that target without losing accuracy;
* `bigger_dev` (`--splits N` random halves of the test problems): the dev split plus one half chooses,
  the other half judges, beside the dev split alone judged on the same half: whether more calibration
  problems would have helped.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import yaml

from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import choose_exit, draft_token_ids, exit_outcome, grid, load_traces, trace_checks
from pipelines.common.provenance import emit_result, provenance
from specexit_core.exit.replay import first_exit


def _outcomes(traces: list[dict], settings: list, ids: dict) -> list[list[tuple[bool, int]]]:
    """[setting][trace] -> (right, think tokens): the calibration replay's per-trace rule."""
    checks: dict = {}
    out = []
    for s in settings:
        row = []
        for i, tr in enumerate(traces):
            if (i, s.alpha) not in checks:
                checks[(i, s.alpha)] = trace_checks(tr, s.alpha, ids)
            row.append(exit_outcome(tr, first_exit(checks[(i, s.alpha)], s)))
        out.append(row)
    return out


def _points(outcomes: list, keep: list[int]) -> list[dict]:
    """Accuracy and mean think tokens of every setting over the traces `keep`."""
    return [
        {"accuracy": statistics.mean(row[j][0] for j in keep), "think_tokens": statistics.mean(row[j][1] for j in keep)}
        for row in outcomes
    ]


def _base(traces: list[dict], keep: list[int]) -> dict:
    return {
        "eagle3_accuracy": statistics.mean(traces[j]["correct"] for j in keep),
        "eagle3_think": statistics.mean(traces[j]["think_tokens"] for j in keep),
        "oracle_think": statistics.mean(traces[j]["oracle_think"] for j in keep),
    }


def _figures(i: int, points_by_t: dict, base_by_t: dict) -> dict:
    out = {}
    for t, pts in points_by_t.items():
        b, p = base_by_t[t], pts[i]
        out[str(t)] = {
            "accuracy_vs_eagle3_points": round(100 * (p["accuracy"] - b["eagle3_accuracy"]), 1),
            "think_tokens": round(p["think_tokens"], 1),
            "vs_oracle": round(p["think_tokens"] / b["oracle_think"], 3),
            "vs_eagle3": round(p["think_tokens"] / b["eagle3_think"], 3),
        }
    return out


def _choose(parts: list[tuple[dict, dict, dict]], temps: list, tolerance: float) -> int:
    """The calibration's rule over the union of (outcomes, traces, kept ids) parts, per temperature."""
    points, ref = {}, {}
    for t in temps:
        rows = [(o[t], tr[t], keep[t]) for o, tr, keep in parts]
        n = sum(len(k) for _, _, k in rows)
        points[t] = [
            {
                "accuracy": sum(sum(o[i][j][0] for j in k) for o, _, k in rows) / n,
                "think_tokens": sum(sum(o[i][j][1] for j in k) for o, _, k in rows) / n,
            }
            for i in range(len(rows[0][0]))
        ]
        ref[t] = sum(sum(tr[j]["correct"] for j in k) for _, tr, k in rows) / n
    return choose_exit(points, ref, tolerance)


def _bigger_dev(dev, test, od, ot, temps, tolerance, splits: int) -> dict:
    """Would more dev problems have chosen better? Half the test problems join the dev split, the
    other half judges (`splits` random halves); beside it the dev split alone, judged on the same half."""
    ids0 = [tr["id"] for tr in test[temps[0]]]
    runs: dict = {"dev_alone": [], "dev_plus_half_test": []}
    all_dev = {t: list(range(len(dev[t]))) for t in temps}
    for seed in range(splits):
        order = sorted(ids0, key=lambda x: random.Random(f"{seed}:{x}").random())
        half = set(order[: len(order) // 2])
        a = {t: [j for j, tr in enumerate(test[t]) if tr["id"] in half] for t in temps}
        b = {t: [j for j, tr in enumerate(test[t]) if tr["id"] not in half] for t in temps}
        judge_pts = {t: _points(ot[t], b[t]) for t in temps}
        judge_base = {t: _base(test[t], b[t]) for t in temps}
        for name, parts in (
            ("dev_alone", [(od, dev, all_dev)]),
            ("dev_plus_half_test", [(od, dev, all_dev), (ot, test, a)]),
        ):
            runs[name].append(_figures(_choose(parts, temps, tolerance), judge_pts, judge_base))
    summary = {}
    for name, rs in runs.items():
        summary[name] = {
            str(t): {
                k: {
                    "mean": round(statistics.mean(r[str(t)][k] for r in rs), 3),
                    "min": min(r[str(t)][k] for r in rs),
                    "max": max(r[str(t)][k] for r in rs),
                }
                for k in ("accuracy_vs_eagle3_points", "vs_oracle")
            }
            for t in temps
        }
    return {"splits": splits, "judged_on": "the other half of the test problems", **summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir")
    ap.add_argument("teacher", help="the recipe folder under examples/, e.g. qwen3_like")
    ap.add_argument("--splits", type=int, default=10, help="random halves for the bigger-dev check (0: skip it)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    wd = Path(a.workdir)
    cfg = CalibrateConfig.model_validate(yaml.safe_load(Path(f"examples/{a.teacher}/calibrate.yaml").read_text()))
    settings = grid(cfg)
    ids = draft_token_ids(str(wd / "draft"))
    calibrated = json.loads((wd / "calibrated.json").read_text())
    chosen, temps = calibrated["exit"], list(calibrated["calibration"]["temperatures"])  # the run's, not the recipe's
    dev = {t: load_traces(str(wd / "calibrate" / "dev"), t) for t in temps}
    test = {t: load_traces(str(wd / "eval"), t) for t in temps}
    od = {t: _outcomes(dev[t], settings, ids) for t in temps}
    ot = {t: _outcomes(test[t], settings, ids) for t in temps}
    every = {t: list(range(len(test[t]))) for t in temps}
    test_points = {t: _points(ot[t], every[t]) for t in temps}
    base = {t: _base(test[t], every[t]) for t in temps}
    i_chosen = next(i for i, s in enumerate(settings) if s.to_dict() == chosen)
    i_best = _choose([(ot, test, every)], temps, cfg.tolerance)
    doc = {
        "what": "the calibration grid replayed on a demo run's test traces: the dev-chosen exit, the exit the same "
        "rule would pick on the test split itself (an upper bound, not a result), and whether a bigger dev split "
        "would have chosen better",
        **provenance("python scripts/exit_headroom.py " + " ".join(sys.argv[1:])),
        "teacher": a.teacher,
        "grid_size": len(settings),
        "tolerance": cfg.tolerance,
        "problems": {"dev": {str(t): len(dev[t]) for t in temps}, "test": {str(t): len(test[t]) for t in temps}},
        "test_split": {str(t): {k: round(v, 3) for k, v in b.items()} for t, b in base.items()},
        "calibrated": {"exit": chosen, **_figures(i_chosen, test_points, base)},
        "best_on_test": {"exit": settings[i_best].to_dict(), **_figures(i_best, test_points, base)},
    }
    if a.splits:
        doc["bigger_dev"] = _bigger_dev(dev, test, od, ot, temps, cfg.tolerance, a.splits)
    emit_result(doc, a.out)


if __name__ == "__main__":
    main()
