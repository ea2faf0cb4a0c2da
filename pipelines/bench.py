"""`python -m pipelines.bench`: rows/s of each stage on the toy, and labeling with 1 vs 2 engines.

Runs the shipped toy configs (examples/toy/*.yaml) in one local Ray cluster with fresh output
folders under --workdir. `rows_per_s` is end to end (Ray Data start, engine start-up and
writing included); `engine_rows_per_s` counts the engine-busy window only (first request to last
answer, over all engines). On a 2-core machine two engine actors share the same cores, so expect a
ratio near 1 (or below: two engines start up at once), not 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from pipelines.common.runtime import init_ray
from pipelines.common.stage_cli import setup_logging
from pipelines.stages import load_stage_config
from specexit_core.typed_config import resolve_path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "toy"


def _fresh(p: str) -> str:
    shutil.rmtree(p, ignore_errors=True)
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.bench")
    ap.add_argument("--n", type=int, default=1024, help="toy prompts")
    ap.add_argument("--chunk-rows", type=int, default=16, help="rows per output part")
    ap.add_argument("--workdir", default="runs/bench")
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--teacher", default=None, help="teacher folder (default: the shipped toy teacher)")
    args = ap.parse_args(argv)
    setup_logging()
    from pipelines import labels, traces, train_draft

    wd = resolve_path(args.workdir)
    tr = load_stage_config("traces", str(EXAMPLES / "traces.yaml"), output=_fresh(f"{wd}/traces"), limit=args.n)
    lb = load_stage_config("labels", str(EXAMPLES / "labels.yaml"), input=tr.output)
    td = load_stage_config(
        "train_draft", str(EXAMPLES / "train_draft.yaml"), input=f"{wd}/labels_1", output=_fresh(f"{wd}/draft")
    )
    tr.input.n = args.n
    tr.chunk_rows = lb.chunk_rows = args.chunk_rows
    if args.teacher:
        tr.engine.model = lb.engine.model = td.target = resolve_path(args.teacher)
    init_ray(tr.ray)
    res: dict = {"n_prompts": args.n}
    res["traces"] = traces.run(tr)
    for k in (1, 2):
        lb.engine.concurrency = k
        lb.output = _fresh(f"{wd}/labels_{k}")
        res[f"labels_{k}_engine"] = labels.run(lb)
    td.steps, td.checkpoint_every, td.log_every = args.train_steps, args.train_steps, 5
    td.run_name, td.storage_path = f"bench-{int(time.time())}", _fresh(f"{wd}/ray_train")
    t = train_draft.run(td)
    res["train_draft"] = {**t, "steps_per_s": round(args.train_steps / t["seconds"], 3)}
    one, two = res["labels_1_engine"], res["labels_2_engine"]
    res["labels_2_vs_1_engine_ratio"] = {
        "rows_per_s": round(two["rows_per_s"] / one["rows_per_s"], 3),
        "engine_rows_per_s": (
            round(two["engine_rows_per_s"] / one["engine_rows_per_s"], 3)
            if one.get("engine_rows_per_s") and two.get("engine_rows_per_s")
            else None
        ),
    }
    print("SPECEXIT_BENCH " + json.dumps(res, indent=2, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
