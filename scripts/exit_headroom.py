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
  driven by this run's draft signals, can meet that target without losing accuracy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import _draft_token_ids, choose_exit, grid, load_traces, replay
from pipelines.common.provenance import emit_result, provenance


def _per_trace(traces: list[dict]) -> dict:
    return {
        "eagle3_accuracy": statistics.mean(t["correct"] for t in traces),
        "eagle3_think": statistics.mean(t["think_tokens"] for t in traces),
        "oracle_think": statistics.mean(t["oracle_think"] for t in traces),
    }


def _figures(i: int, points_by_t: dict, base_by_t: dict) -> dict:
    out = {"exit": points_by_t[next(iter(points_by_t))][i]["exit"]}
    for t, pts in points_by_t.items():
        b, p = base_by_t[t], pts[i]
        out[str(t)] = {
            "accuracy_vs_eagle3_points": round(100 * (p["accuracy"] - b["eagle3_accuracy"]), 1),
            "think_tokens": round(p["think_tokens"], 1),
            "vs_oracle": round(p["think_tokens"] / b["oracle_think"], 3),
            "vs_eagle3": round(p["think_tokens"] / b["eagle3_think"], 3),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir")
    ap.add_argument("teacher", help="the recipe folder under examples/, e.g. qwen3_like")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    wd = Path(a.workdir)
    cfg = CalibrateConfig.model_validate(yaml.safe_load(Path(f"examples/{a.teacher}/calibrate.yaml").read_text()))
    settings = grid(cfg)
    ids = _draft_token_ids(str(wd / "draft"))
    calibrated = json.loads((wd / "calibrated.json").read_text())
    chosen, temps = calibrated["exit"], list(calibrated["calibration"]["temperatures"])  # the run's, not the recipe's
    dev = {t: load_traces(str(wd / "calibrate" / "dev"), t) for t in temps}
    test = {t: load_traces(str(wd / "eval"), t) for t in temps}
    test_points = {t: replay(test[t], settings, ids) for t in temps}
    base = {t: _per_trace(test[t]) for t in temps}
    i_chosen = next(i for i, p in enumerate(test_points[temps[0]]) if p["exit"] == chosen)
    i_best = choose_exit(test_points, {t: base[t]["eagle3_accuracy"] for t in temps}, cfg.tolerance)
    doc = {
        "what": "the calibration grid replayed on a demo run's test traces: the dev-chosen exit, and the exit "
        "the same rule would pick on the test split itself (an upper bound, not a result)",
        **provenance("python scripts/exit_headroom.py " + " ".join(sys.argv[1:])),
        "teacher": a.teacher,
        "grid_size": len(settings),
        "tolerance": cfg.tolerance,
        "problems": {"dev": {str(t): len(dev[t]) for t in temps}, "test": {str(t): len(test[t]) for t in temps}},
        "test_split": {str(t): {k: round(v, 3) for k, v in b.items()} for t, b in base.items()},
        "calibrated": _figures(i_chosen, test_points, base),
        "best_on_test": _figures(i_best, test_points, base),
    }
    emit_result(doc, a.out)


if __name__ == "__main__":
    main()
