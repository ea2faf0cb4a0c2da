"""Shared command line of the three data jobs: `--config FILE` plus `--input`, `--output`, `--limit`.

Each stage's `__main__` calls `main(stage, its config model, run)`; `run(cfg)` returns the summary dict that is printed
as the last stdout line (`SPECEXIT_SUMMARY {...json...}`), so scripts and tests can parse it from
`ray job logs`. Exit code: 0 when every input row is accounted for, 1 otherwise or when the error
rows exceed `max_error_rate` (summary key `failed`), 2 on a bad config or a refused resume (the
output holds another run's rows: pipelines/common/run_identity.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import TypeVar

from pipelines.common.prompt_source import InputConfig, input_overrides
from pipelines.common.run_identity import RunIdentityMismatch
from specexit_core.typed_config import ConfigError, StrictModel, load_config

SUMMARY_PREFIX = "SPECEXIT_SUMMARY "
M = TypeVar("M", bound=StrictModel)


def load_stage(
    model: type[M],
    stage: str,
    path: str | None,
    *,
    input: str | None = None,
    output: str | None = None,
    limit: int | None = None,
    raw: dict | None = None,
) -> M:
    """A stage's config from YAML (or `raw`) with the command-line overrides applied, validated,
    paths resolved (`load_config`). `input` is a prompt source where the stage reads prompts (its
    reader is inferred from the name), else the stage's input folder. Raises ConfigError."""
    reads_prompts = model.model_fields["input"].annotation in (InputConfig, "InputConfig")
    inputs = input_overrides(input) if reads_prompts else {"input": input}
    return load_config(model, path, raw=raw, what=stage, overrides={"output": output, "limit": limit, **inputs})


def parse_args(stage: str, argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m pipelines.{stage}", description=f"SpecExit {stage} job (Ray)")
    ap.add_argument("--config", required=True, help="YAML config file (unknown keys are errors)")
    ap.add_argument("--input", help="override the config's input path")
    ap.add_argument("--output", help="override the config's output path")
    ap.add_argument("--limit", type=int, help="process only the first N input rows")
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap.parse_args(argv)


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def print_summary(summary: dict) -> None:
    print(SUMMARY_PREFIX + json.dumps(summary, sort_keys=True), flush=True)


def parse_summary(text: str) -> dict | None:
    """The last summary line in a log (None if there is none)."""
    found = None
    for line in text.splitlines():
        i = line.find(SUMMARY_PREFIX)
        if i >= 0:
            found = json.loads(line[i + len(SUMMARY_PREFIX) :])
    return found


def main(stage: str, model: type[M], run: Callable[[M], dict], argv: list[str] | None = None) -> int:
    args = parse_args(stage, argv)
    setup_logging(args.verbose)
    if args.limit is not None and args.limit < 1:
        print(f"--limit must be >= 1, got {args.limit}", file=sys.stderr)
        return 2
    try:
        cfg = load_stage(model, stage, args.config, input=args.input, output=args.output, limit=args.limit)
    except (ConfigError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 2
    try:
        summary = run(cfg)
    except RunIdentityMismatch as e:  # before any work: nothing was written
        print(str(e), file=sys.stderr)
        return 2
    print_summary(summary)
    if summary.get("failed"):
        print(f"{stage}: {summary['failed']}", file=sys.stderr)
        return 1
    return 0 if summary.get("complete", False) else 1
