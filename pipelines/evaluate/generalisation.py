"""Does the exit generalise? One calibrated exit, evaluated in distribution and on shifted test sets.

    python -m pipelines.evaluate.generalisation --config examples/toy/generalisation.yaml [--limit N]

The exit was chosen on the dev split of the training distribution (`specexit calibrate`); this job
runs the ordinary evaluation (`run_evaluation`, nothing re-implemented) once per distribution: the
config's own input (in distribution) and the same input with each `input.shift`
(`specexit_core/toy/shifts.py`), each into `<output>/<distribution>/`. Then
`<output>/_generalisation.json` holds, per distribution and method, accuracy with its 95%
bootstrap interval, the paired difference to EAGLE-3 with its interval, think tokens and the saving
against EAGLE-3, and how far each moved from in distribution; `report.md` + `generalisation.png`
render it (`pipelines/report/generalisation.py`). A rerun resumes every distribution's folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from pipelines.common.meta_files import GENERALISATION_FILE, write_meta
from pipelines.evaluate.config import EvalConfig
from specexit_core.toy.shifts import SHIFTS, Shift
from specexit_core.typed_config import ConfigError, StrictModel, load_config, resolve_path

IN_DISTRIBUTION = "in_distribution"
# what a distribution's row carries per method (from the evaluation's summary)
_KEEP = ("n", "accuracy", "accuracy_ci95", "accuracy_vs_eagle3", "think_tokens", "latency_s", "exit_rate")


class GeneralisationConfig(StrictModel):
    """The evaluation to repeat (its input: the in-distribution toy set) and the shifts to repeat it on."""

    output: str  # one evaluation folder per distribution under it, _generalisation.json, _report/
    eval: EvalConfig  # its `output` is set per distribution (`<output>/<distribution>`); leave it out
    shifts: list[Shift] = Field(default_factory=lambda: list(SHIFTS))

    @model_validator(mode="before")
    @classmethod
    def _eval_output(cls, d):
        # EvalConfig needs an output; each distribution gets its own below `output`, so the recipe
        # does not name one
        if isinstance(d, dict) and isinstance(d.get("eval"), dict) and "output" not in d["eval"]:
            d = {**d, "eval": {**d["eval"], "output": str(d.get("output", ""))}}
        return d

    @field_validator("shifts")
    @classmethod
    def _distinct(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError(f"shifts must be a non-empty list without repeats, got {v}")
        return v

    @model_validator(mode="after")
    def _a_calibrated_toy_run(self):
        inp = self.eval.input
        if inp.kind != "toy" or inp.shift is not None:
            raise ValueError("eval.input must be the in-distribution toy set (kind: toy, no shift)")
        if not self.eval.calibrated:
            raise ValueError("eval.calibrated: the exit under test is a calibrated one (`specexit calibrate` JSON)")
        missing = {"eagle3", "specexit"} - set(self.eval.methods)
        if missing:
            raise ValueError(f"eval.methods needs {sorted(missing)}: savings and accuracy are measured against eagle3")
        return self

    def distributions(self) -> dict[str, EvalConfig]:
        """Name -> the evaluation config of that distribution (in distribution first)."""
        out = {}
        for name in (IN_DISTRIBUTION, *self.shifts):
            shift = None if name == IN_DISTRIBUTION else name
            ev = self.eval.model_copy(deep=True)
            ev.input = ev.input.model_copy(update={"shift": shift})
            ev.output = str(Path(self.output) / name)
            out[name] = ev
        return out

    def resolve_paths(self) -> GeneralisationConfig:
        self.output = resolve_path(self.output)
        self.eval.resolve_paths()
        return self


def _method_row(m: dict, eagle3: dict | None) -> dict:
    row = {k: m.get(k) for k in _KEEP}
    e = (eagle3 or {}).get("think_tokens")
    row["think_saving_vs_eagle3"] = None if not e or m.get("think_tokens") is None else 1 - m["think_tokens"] / e
    return row


def _moves(row: dict, base: dict) -> dict:
    """Shifted minus in distribution: accuracy and its gap to eagle3 in points, the saving in points."""

    def d(a, b, scale=100.0):
        return None if a is None or b is None else scale * (a - b)

    vs, vs0 = row.get("accuracy_vs_eagle3"), base.get("accuracy_vs_eagle3")
    return {
        "accuracy_points": d(row.get("accuracy"), base.get("accuracy")),
        "vs_eagle3_points": d(vs and vs["points"], vs0 and vs0["points"], 1.0),
        "think_tokens": d(row.get("think_tokens"), base.get("think_tokens"), 1.0),
        "saving_points": d(row.get("think_saving_vs_eagle3"), base.get("think_saving_vs_eagle3")),
    }


def summarise(summaries: dict[str, dict]) -> dict:
    """Evaluation summaries per distribution (`run_evaluation`'s, greedy headline table) -> the
    generalisation table: {"distributions": {name: {"n", "methods": {m: row}}}, "in_distribution"}."""
    dists: dict = {}
    for name, s in summaries.items():
        ms = s.get("methods", {})
        dists[name] = {
            "n": s.get("n"),
            "errors": s.get("errors"),
            "methods": {m: _method_row(r, ms.get("eagle3")) for m, r in ms.items() if r.get("n")},
        }
    base = dists.get(IN_DISTRIBUTION)
    if base is not None:
        for name, d in dists.items():
            if name != IN_DISTRIBUTION:
                for m, row in d["methods"].items():
                    if m in base["methods"]:
                        row["moved_from_in_distribution"] = _moves(row, base["methods"][m])
    return {"in_distribution": IN_DISTRIBUTION if base is not None else None, "distributions": dists}


def run_generalisation(cfg: GeneralisationConfig) -> dict:
    """Every distribution's evaluation (resumed where done), then `<output>/_generalisation.json`
    with the provenance docs/results/ keeps (command, commit, machine, date)."""
    from pipelines.common.provenance import provenance
    from pipelines.evaluate.job import run_evaluation

    t0 = time.time()
    summaries, seconds = {}, {}
    for name, ev in cfg.distributions().items():
        t = time.time()
        summaries[name] = run_evaluation(ev)
        seconds[name] = round(time.time() - t, 1)
    out = {
        **provenance(),
        **summarise(summaries),
        "shifts": list(cfg.shifts),
        "calibrated": cfg.eval.calibrated,
        "specexit_exit": summaries[IN_DISTRIBUTION].get("specexit_exit"),
        "temperature": cfg.eval.temperatures[0],
        "seconds": {"total": round(time.time() - t0, 1), **seconds},
        "output": cfg.output,
    }
    Path(cfg.output).mkdir(parents=True, exist_ok=True)
    write_meta(cfg.output, GENERALISATION_FILE, json.dumps(out, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    from pipelines.common.stage_cli import print_summary, setup_logging

    ap = argparse.ArgumentParser(
        prog="python -m pipelines.evaluate.generalisation",
        description="a calibrated exit in distribution and on shifted toy test sets",
    )
    ap.add_argument("--config", required=True, help="YAML (GeneralisationConfig; unknown keys are errors)")
    ap.add_argument("--output", help="override the output folder (one evaluation folder per distribution under it)")
    ap.add_argument("--limit", type=int, help="only the first N problems of every distribution")
    ap.add_argument("--no-report", action="store_true", help="skip report.md + generalisation.png")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    if args.limit is not None and args.limit < 1:
        print(f"--limit must be >= 1, got {args.limit}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(
            GeneralisationConfig,
            args.config,
            what="generalisation",
            overrides={"output": args.output, "eval.limit": args.limit},
        )
    except (ConfigError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 2
    from pipelines.common.run_identity import RunIdentityMismatch
    from pipelines.common.runtime import stop_ray_quietly

    try:
        out = run_generalisation(cfg)
    except RunIdentityMismatch as e:
        print(str(e), file=sys.stderr)
        return 2
    finally:
        stop_ray_quietly()
    if not args.no_report:
        from pipelines.report.generalisation import write_generalisation_report

        out["report"] = str(write_generalisation_report(cfg.output))
    print_summary(out)
    return 0 if all(d["errors"] == 0 for d in out["distributions"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
