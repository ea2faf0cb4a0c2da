"""Run a command the way a user does and read its machine-readable result.

Two output conventions exist, and `output_json` reads both:
- the pipeline stages (`python -m pipelines.<stage>`, also through `ray job submit` / `ray job logs`)
  print a `SPECEXIT_SUMMARY {...}` line (pipelines.common.stage_cli), possibly among log lines;
- the `specexit ... --json` commands print a JSON document as the last thing on stdout, on one line
  or indented over several.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from os import PathLike

from support.paths import REPO_ROOT


def specexit(*args: str) -> list[str]:
    """The argv of `specexit ARGS` for this venv (the CLI module, so no installed script is needed)."""
    return [sys.executable, "-m", "specexit_app.cli", *args]


def run(
    argv: Sequence[str | PathLike], *, timeout: float, env: dict | None = None, cwd: str | PathLike = REPO_ROOT
) -> subprocess.CompletedProcess[str]:
    """`argv` in the checkout with captured text output; the exit status is the caller's to check."""
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def tail(p: subprocess.CompletedProcess, n: int = 4000) -> str:
    """The ends of stdout and stderr: the message for a failed command."""
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-n:]}\n--- stderr\n{p.stderr[-n:]}"


def output_json(stdout: str) -> dict:
    """The command's result: the last SPECEXIT_SUMMARY line if there is one, else the JSON document
    that ends stdout. Fails the test (with the output's end) when there is neither."""
    from pipelines.common.stage_cli import parse_summary

    summary = parse_summary(stdout)
    if summary is not None:
        return summary
    lines = stdout.rstrip().splitlines()
    # a document printed last starts on a line of its own with "{" or "[" (indented JSON nests deeper)
    for i in reversed(range(len(lines))):
        if lines[i].startswith(("{", "[")):
            try:
                return json.loads("\n".join(lines[i:]))
            except ValueError:
                continue
    raise AssertionError(f"no SPECEXIT_SUMMARY line and no JSON at the end of the output:\n{stdout[-3000:]}")


def run_json(
    argv: Sequence[str | PathLike], *, timeout: float, env: dict | None = None, cwd: str | PathLike = REPO_ROOT
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`run`, assert it succeeded, and return it with its `output_json`."""
    p = run(argv, timeout=timeout, env=env, cwd=cwd)
    assert p.returncode == 0, tail(p)
    return p, output_json(p.stdout)
