"""Shared command line of the three jobs: `--config FILE` plus `--input`, `--output`, `--limit`
(`load_stage_config`).

Each stage module calls `main(stage, run)`; `run(cfg)` returns the summary dict that is printed
as the last stdout line (`SPECEXIT_SUMMARY {...json...}`), so scripts and tests can parse it from
`ray job logs`. Exit code: 0 when every input row is accounted for, 1 otherwise, 2 on a bad config.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable

from pipelines.labels.config import LabelsConfig
from pipelines.traces.config import TracesConfig, input_overrides
from pipelines.train_draft.config import TrainDraftConfig
from specexit_core.typed_config import ConfigError, StrictModel, load_config

SUMMARY_PREFIX = "SPECEXIT_SUMMARY "
STAGES: dict[str, type[StrictModel]] = {"traces": TracesConfig, "labels": LabelsConfig, "train_draft": TrainDraftConfig}


def load_stage_config(stage: str, path: str | None, *, input: str | None = None, output: str | None = None,
                      limit: int | None = None, raw: dict | None = None):
    """The stage's config from YAML (or `raw`) with the command-line overrides applied, validated,
    paths resolved (`load_config`). `input` is the traces stage's prompt source (its reader is
    inferred from the name) and the other stages' input folder. Raises ConfigError."""
    inputs = input_overrides(input) if stage == "traces" else {"input": input}
    return load_config(STAGES[stage], path, raw=raw, what=stage,
                       overrides={"output": output, "limit": limit, **inputs})


def parse_args(stage: str, argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m pipelines.{stage}", description=f"SpecExit {stage} job (Ray)")
    ap.add_argument("--config", required=True, help="YAML config file (unknown keys are errors)")
    ap.add_argument("--input", help="override the config's input path")
    ap.add_argument("--output", help="override the config's output path")
    ap.add_argument("--limit", type=int, help="process only the first N input rows")
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap.parse_args(argv)


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def print_summary(summary: dict) -> None:
    print(SUMMARY_PREFIX + json.dumps(summary, sort_keys=True), flush=True)


def parse_summary(text: str) -> dict | None:
    """The last summary line in a log (None if there is none)."""
    found = None
    for line in text.splitlines():
        i = line.find(SUMMARY_PREFIX)
        if i >= 0:
            found = json.loads(line[i + len(SUMMARY_PREFIX):])
    return found


def main(stage: str, run: Callable[[object], dict], argv: list[str] | None = None) -> int:
    args = parse_args(stage, argv)
    setup_logging(args.verbose)
    if args.limit is not None and args.limit < 1:
        print(f"--limit must be >= 1, got {args.limit}", file=sys.stderr)
        return 2
    try:
        cfg = load_stage_config(stage, args.config, input=args.input, output=args.output, limit=args.limit)
    except (ConfigError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 2
    summary = run(cfg)
    print_summary(summary)
    return 0 if summary.get("complete", False) else 1
