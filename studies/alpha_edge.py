"""Is a certified choice at the edge of the alpha grid hiding a better setting below it?

    python studies/alpha_edge.py DEV_DIR DRAFT CALIBRATE_YAML OUT.json [--extra 0.01,0.02,0.03]

DEV_DIR is a finished calibration dev run (a demo's `calibrate/dev`), DRAFT its draft. The recipe's
grid and the same grid with `--extra` alphas added are each replayed over the dev traces at the
recipe's temperatures and certified (Learn then Test, the recipe's epsilon, delta, loss, order share
and seed: `pipelines.calibrate.certificate.certified_choice`); the JSON holds both choices, their
certified bounds, dev think tokens and whether a chosen value still sits at a grid edge.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import (
    certify_as_configured,
    draft_token_ids,
    exit_result,
    grid,
    grid_edges,
    load_traces,
    replay_outcomes,
)
from specexit_core.typed_config import load_config


def choose(base: CalibrateConfig, alphas: list[float], traces_by_t: dict, ids: dict) -> dict:
    cfg = base.model_copy(update={"alphas": alphas})
    settings = grid(cfg)
    t0 = time.time()
    res = {t: replay_outcomes(trs, settings, ids, exit_result) for t, trs in traces_by_t.items()}
    cert = certify_as_configured(cfg, traces_by_t, res)
    ch = cert["chosen"]
    return {
        "alphas": alphas,
        "grid": len(settings),
        "chosen": settings[ch].to_dict() if ch is not None else None,
        "bound": cert["bound"],
        "think_tokens_dev": (
            {f"{t:g}": statistics.mean(r[1] for r in res[t][ch]) for t in traces_by_t} if ch is not None else None
        ),
        "edges": grid_edges(cfg, settings[ch]) if ch is not None else [],
        "replay_s": round(time.time() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dev_dir")
    ap.add_argument("draft")
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--extra", default="0.01,0.02,0.03", help="alphas added to the recipe's")
    a = ap.parse_args()
    base = load_config(CalibrateConfig, a.config, what="calibrate")
    ids = draft_token_ids(a.draft)
    traces_by_t = {t: load_traces(a.dev_dir, t) for t in base.temperatures}
    wider = sorted({*(float(x) for x in a.extra.split(",")), *base.alphas})
    out = {
        name: choose(base, alphas, traces_by_t, ids)
        for name, alphas in (("recipe", list(base.alphas)), ("wider", wider))
    }
    for name, r in out.items():
        print(name, json.dumps(r))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
