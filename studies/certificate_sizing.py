"""What a 1-point certificate costs on a teacher's signals: the loss-vs-think-tokens front of the grid
and the dev size each point of it needs (#39 item 4: "say what dev size a certificate of 1 point at
delta 0.1 needs at the observed disagreement rates").

    python studies/certificate_sizing.py DEV_DIR DRAFT CALIBRATE_YAML OUT.json [--epsilon 0.01 --delta 0.1]

DEV_DIR is a finished calibration dev run (greedy and sampled). Every setting of the recipe's grid is
replayed over all its traces; a setting's loss is its disagreement rate (the answer forced at the exit
differs from the one the trace reaches at its natural end), the largest over the temperatures; its
cost the mean think tokens over them. For each point of the Pareto front (loss, cost) the JSON gives
its think tokens per temperature, their ratio to the oracle's, and how many testing prompts would
certify loss <= epsilon at level delta if the rate held (`risk_control.dev_size_needed`; null: no
size does, the rate is at or above epsilon).
"""

from __future__ import annotations

import argparse
import json
import statistics

from pipelines.calibrate.certificate import int_mean, prompt_losses
from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import draft_token_ids, exit_result, grid, load_traces, replay_outcomes
from pipelines.common.provenance import provenance
from specexit_core.exit.risk_control import dev_size_needed
from specexit_core.typed_config import load_config

SHOWN = ("method", "confidence_threshold", "progress_threshold", "remaining_threshold", "alpha")


def sizing(dev: str, draft: str, config: str, *, epsilon: float, delta: float, max_rate: float = 0.06) -> dict:
    cfg = load_config(CalibrateConfig, config, what="calibrate")
    ids = draft_token_ids(draft)
    traces_by_t = {t: load_traces(dev, t) for t in cfg.temperatures}
    settings = grid(cfg)
    res = {t: replay_outcomes(trs, settings, ids, exit_result) for t, trs in traces_by_t.items()}
    losses = prompt_losses(traces_by_t, res, "disagreement")
    rate = [max(statistics.mean(losses[p][s].values()) for p in losses) for s in range(len(settings))]
    think = {t: [int_mean([r[1] for r in res[t][s]]) for s in range(len(settings))] for t in traces_by_t}
    cost = [statistics.mean(think[t][s] for t in traces_by_t) for s in range(len(settings))]
    oracle = {t: statistics.mean(tr["oracle_think"] for tr in trs) for t, trs in traces_by_t.items()}
    front, best = [], float("inf")
    for s in sorted(range(len(settings)), key=lambda s: (cost[s], rate[s])):
        if rate[s] < best:
            front.append(s)
            best = rate[s]
    return {
        "traces": {f"{t:g}": len(trs) for t, trs in traces_by_t.items()},
        "epsilon": epsilon,
        "delta": delta,
        "eagle3_think_tokens": {
            f"{t:g}": statistics.mean(tr["think_tokens"] for tr in trs) for t, trs in traces_by_t.items()
        },
        "oracle_think_tokens": {f"{t:g}": v for t, v in oracle.items()},
        "front": [
            {
                "disagreement": rate[s],
                "think_tokens": {f"{t:g}": round(think[t][s], 1) for t in traces_by_t},
                "vs_oracle": {f"{t:g}": round(think[t][s] / oracle[t], 2) for t in traces_by_t},
                "dev_size_needed": dev_size_needed(rate[s], epsilon, delta),
                "exit": {k: v for k, v in settings[s].to_dict().items() if k in SHOWN},
            }
            for s in front
            if rate[s] <= max_rate
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dev_dir")
    ap.add_argument("draft")
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--epsilon", type=float, default=0.01)
    ap.add_argument("--delta", type=float, default=0.1)
    a = ap.parse_args()
    res = sizing(a.dev_dir, a.draft, a.config, epsilon=a.epsilon, delta=a.delta)
    res.update(dev_dir=a.dev_dir, draft=a.draft, config=a.config, provenance=provenance())
    for p in res["front"]:
        print(json.dumps(p))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
