"""How far any exit of the calibration grid could go on a demo run's test split: the headroom behind a
missed think-token or speed-up target.

    python studies/exit_headroom.py WORKDIR TEACHER [--out F.json]

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
* `calibrated_losses`: the problems the engine's own SpecExit run lost against EAGLE-3, and how many of
  them exited at a break whose greedy forced answer is wrong too (an exit too early, not an unlucky answer);
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
from pipelines.calibrate.job import choose_exit, draft_token_ids, grid, load_traces, replay_outcomes, trace_checks
from pipelines.common.parts import read_all
from pipelines.common.provenance import emit_result, provenance
from specexit_core.exit import ExitConfig


def _subset(outcomes: list, traces: list[dict], keep: list[int]) -> tuple[list, list[dict]]:
    """The outcomes ([setting][trace]) and traces of the traces `keep`."""
    return [[row[j] for j in keep] for row in outcomes], [traces[j] for j in keep]


def _pool(*parts: tuple[list, list[dict]]) -> tuple[list, list[dict]]:
    """Several (outcomes, traces) subsets as one."""
    return [sum((o[i] for o, _ in parts), []) for i in range(len(parts[0][0]))], sum((t for _, t in parts), [])


def _points(outcomes: list) -> list[dict]:
    """Accuracy and mean think tokens of every setting (what `replay` returns, from its outcomes)."""
    return [
        {"accuracy": statistics.mean(ok for ok, _ in row), "think_tokens": statistics.mean(n for _, n in row)}
        for row in outcomes
    ]


def _base(traces: list[dict]) -> dict:
    return {
        "eagle3_accuracy": statistics.mean(t["correct"] for t in traces),
        "eagle3_think": statistics.mean(t["think_tokens"] for t in traces),
        "oracle_think": statistics.mean(t["oracle_think"] for t in traces),
    }


def _figures(i: int, pools: dict) -> dict:
    """Setting `i` judged on each temperature's (outcomes, traces)."""
    out = {}
    for t, (outcomes, traces) in pools.items():
        b, p = _base(traces), _points([outcomes[i]])[0]
        out[str(t)] = {
            "accuracy_vs_eagle3_points": round(100 * (p["accuracy"] - b["eagle3_accuracy"]), 1),
            "think_tokens": round(p["think_tokens"], 1),
            "vs_oracle": round(p["think_tokens"] / b["oracle_think"], 3),
            "vs_eagle3": round(p["think_tokens"] / b["eagle3_think"], 3),
        }
    return out


def _choose(pools: dict, tolerance: float) -> int:
    """The calibration's own rule (`choose_exit`) on each temperature's (outcomes, traces)."""
    points = {t: _points(o) for t, (o, _) in pools.items()}
    ref = {t: _base(trs)["eagle3_accuracy"] for t, (_, trs) in pools.items()}
    return choose_exit(points, ref, tolerance)


def _bigger_dev(dev: dict, test: dict, tolerance: float, splits: int) -> dict:
    """Would more dev problems have chosen better? Half the test problems join the dev split, the
    other half judges (`splits` random halves); beside it the dev split alone, judged on the same half.
    `dev` / `test`: temperature -> (outcomes, traces)."""
    temps = list(test)
    ids0 = [tr["id"] for tr in test[temps[0]][1]]
    runs: dict = {"dev_alone": [], "dev_plus_half_test": []}
    for seed in range(splits):
        order = sorted(ids0, key=lambda x: random.Random(f"{seed}:{x}").random())
        half = set(order[: len(order) // 2])

        def side(t, inside: bool, half=half):
            o, trs = test[t]
            return _subset(o, trs, [j for j, tr in enumerate(trs) if (tr["id"] in half) == inside])

        judge = {t: side(t, False) for t in temps}
        for name, pools in (
            ("dev_alone", dev),
            ("dev_plus_half_test", {t: _pool(dev[t], side(t, True)) for t in temps}),
        ):
            runs[name].append(_figures(_choose(pools, tolerance), judge))
    summary = {
        name: {
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
        for name, rs in runs.items()
    }
    return {"splits": splits, "judged_on": "the other half of the test problems", **summary}


def _calibrated_losses(wd: Path, test: dict, chosen: ExitConfig, ids: dict) -> dict:
    """Per temperature: the problems the engine's own SpecExit run got wrong where EAGLE-3 was right, and
    how many of them exited at a break whose greedy forced answer (the oracle's probe) is wrong too, i.e.
    exited too early rather than sampled an unlucky answer after a good exit."""
    rows = read_all(str(wd / "eval"), ["problem_id", "status", "method", "temperature", "correct", "think_tokens"])
    live = {
        (r["problem_id"], round(float(r["temperature"]), 2)): r
        for r in rows.to_pylist()
        if r["method"] == "specexit" and r["status"] == "ok"
    }
    out = {}
    for t, (_, traces) in test.items():
        lost = premature = 0
        for tr in traces:
            r = live.get((tr["id"], round(t, 2)))
            if r is None or r["correct"] or not tr["correct"]:
                continue
            lost += 1
            # the break the engine exited at: the one after which it kept as many think tokens (none: no exit)
            at = {c.think_tokens: c.index for c in trace_checks(tr, chosen.alpha, ids)}.get(r["think_tokens"])
            premature += at is not None and not tr["probes"].get(at, True)
        out[str(t)] = {"lost_vs_eagle3": lost, "exit_probe_also_wrong": premature}
    return out


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
    dev_traces = {t: load_traces(str(wd / "calibrate" / "dev"), t) for t in temps}
    test_traces = {t: load_traces(str(wd / "eval"), t) for t in temps}
    dev = {t: (replay_outcomes(trs, settings, ids), trs) for t, trs in dev_traces.items()}
    test = {t: (replay_outcomes(trs, settings, ids), trs) for t, trs in test_traces.items()}
    i_chosen = next(i for i, s in enumerate(settings) if s.to_dict() == chosen)
    i_best = _choose(test, cfg.tolerance)
    doc = {
        "what": "the calibration grid replayed on a demo run's test traces: the dev-chosen exit, the exit the same "
        "rule would pick on the test split itself (an upper bound, not a result), and whether a bigger dev split "
        "would have chosen better",
        **provenance("python studies/exit_headroom.py " + " ".join(sys.argv[1:])),
        "teacher": a.teacher,
        "grid_size": len(settings),
        "tolerance": cfg.tolerance,
        "problems": {
            "dev": {str(t): len(v) for t, v in dev_traces.items()},
            "test": {str(t): len(v) for t, v in test_traces.items()},
        },
        "test_split": {str(t): {k: round(v, 3) for k, v in _base(trs).items()} for t, trs in test_traces.items()},
        "calibrated": {"exit": chosen, **_figures(i_chosen, test)},
        "calibrated_losses": _calibrated_losses(wd, test, settings[i_chosen], ids),
        "best_on_test": {"exit": settings[i_best].to_dict(), **_figures(i_best, test)},
    }
    if a.splits:
        doc["bigger_dev"] = _bigger_dev(dev, test, cfg.tolerance, a.splits)
    emit_result(doc, a.out)


if __name__ == "__main__":
    main()
