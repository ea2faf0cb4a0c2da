"""Calibration's grid replay, vectorised (`replay_outcomes`), against the per-setting loop it replaced,
on a demo's greedy dev traces; the two outputs are asserted equal.

    python studies/replay_speed.py RUN/calibrate/dev RUN/draft
"""

import json
import sys
import time

from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import draft_token_ids, exit_result, grid, load_traces, replay_outcomes, trace_checks
from specexit_core.exit.replay import first_exit
from specexit_core.typed_config import load_config


def per_setting_loop(traces: list[dict], settings: list, ids: dict) -> list[list]:
    """The replay before the check table: `first_exit` per setting and trace."""
    cache: dict = {}
    out = []
    for s in settings:
        row = []
        for i, tr in enumerate(traces):
            if (i, s.alpha) not in cache:
                cache[(i, s.alpha)] = trace_checks(tr, s.alpha, ids)
            row.append(exit_result(tr, first_exit(cache[(i, s.alpha)], s)))
        out.append(row)
    return out


def main() -> None:
    dev, draft = sys.argv[1], sys.argv[2]
    cfg = load_config(CalibrateConfig, "examples/toy/calibrate.yaml", what="calibrate")
    ids = draft_token_ids(draft)
    traces = load_traces(dev, 0.0)
    settings = grid(cfg)
    t0 = time.time()
    fast = replay_outcomes(traces, settings, ids, exit_result)
    t1 = time.time()
    slow = per_setting_loop(traces, settings, ids)
    t2 = time.time()
    assert fast == slow
    res = {
        "traces": len(traces),
        "settings": len(settings),
        "vectorised_s": round(t1 - t0, 2),
        "per_setting_loop_s": round(t2 - t1, 2),
        "equal": True,
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
