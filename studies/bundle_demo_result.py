"""Bundle one `specexit demo --teacher NAME --json` run into docs/results/demo_<name>/: its demo.json
(plus the calibrated file and the targets of the teacher's evaluate recipe, recomputed from the run's
evaluation summary with `pipelines.evaluate.job.target_checks`, so a run made before the recipe set
its `targets` block is judged by them too), the report and its pictures (signals.png as a 64-colour
palette image: a quarter of the size, the same lines).

    python studies/bundle_demo_result.py WORKDIR TEACHER OUT --command "..." --conditions "..." [--label "run 2"]

`--label` names a further run of the same teacher (README's table row `TEACHER LABEL, T`). A run whose
evaluation predates the speed-up intervals gets them from its own evaluation rows (the same
`pipelines.evaluate.job.aggregate`), noted in the bundle's `run.speedup_intervals`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def bundle(wd: Path, teacher: str, out: Path, command: str, conditions: str, label: str | None = None) -> dict:
    from PIL import Image

    from pipelines.common.meta_files import SUMMARY_FILE, meta_path
    from pipelines.evaluate.config import TargetsConfig
    from pipelines.evaluate.job import target_checks
    from specexit_app.demo_config import load_demo_config
    from specexit_core.typed_config import read_yaml

    d = json.loads((wd / "demo.json").read_text())
    ev = json.loads(meta_path(wd / "eval", SUMMARY_FILE).read_text())
    added = _speedup_intervals(wd / "eval", ev, d)
    tg = TargetsConfig(**read_yaml(load_demo_config(teacher=teacher).evaluate).get("targets", {}))
    d["targets_of_the_recipe"] = {t: target_checks(v["methods"], tg) for t, v in ev["by_temperature"].items()}
    d["calibrated"] = json.loads((wd / "calibrated.json").read_text())
    d["run"] = {"command": command, "conditions": conditions, **({"label": label} if label else {})}
    if added:
        d["run"]["speedup_intervals"] = "computed at bundle time from the run's evaluation rows"
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(d, indent=1) + "\n")
    for f in ("report.md", "pareto.png", "latency.png"):
        shutil.copy(wd / "report" / f, out / f)
    Image.open(wd / "report" / "signals.png").convert("RGB").quantize(64).save(out / "signals.png", optimize=True)
    return d["targets_of_the_recipe"]


def _speedup_intervals(eval_dir: Path, ev: dict, d: dict) -> bool:
    """Add each method's `speedup_vs_eagle3` (paired bootstrap interval over the timed problems) to the
    summary and the demo JSON where the run's evaluation did not record it yet; True if it did so."""
    from pipelines.common.parts import read_all
    from pipelines.evaluate.job import aggregate

    if all(
        "speedup_vs_eagle3" in m
        for v in ev["by_temperature"].values()
        for k, m in v["methods"].items()
        if k != "eagle3"
    ):
        return False
    chosen = (d.get("peer_settings") or {}).get("budget")  # the budget row is the point chosen on dev
    by_t = aggregate(read_all(eval_dir).to_pylist(), tolerance=0.0, budget_chosen=chosen)
    for t, v in ev["by_temperature"].items():
        for m, metrics in v["methods"].items():
            sp = by_t[t]["methods"].get(m, {}).get("speedup_vs_eagle3")
            if m != "eagle3" and sp is not None:
                metrics["speedup_vs_eagle3"] = sp
                if m in d["by_temperature"].get(t, {}):
                    d["by_temperature"][t][m]["speedup_vs_eagle3"] = sp
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("teacher")
    ap.add_argument("out", type=Path)
    ap.add_argument("--command", required=True, help="the demo's command line, as run")
    ap.add_argument("--conditions", required=True, help="when, and what else the machine ran")
    ap.add_argument("--label", help="a further run of the same teacher, e.g. 'run 2'")
    a = ap.parse_args()
    for t, checks in bundle(a.workdir, a.teacher, a.out, a.command, a.conditions, a.label).items():
        print(
            f"T = {t}: " + ", ".join(f"{k} {'pass' if c['pass'] else 'MISS'} ({c['value']})" for k, c in checks.items())
        )


if __name__ == "__main__":
    main()
