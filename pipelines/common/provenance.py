"""Where a result came from: the command, the commit, the machine, the date.

Every figure README quotes has its raw JSON under `docs/results/` with these four fields, so a
reader can tell which code on which machine produced it (`tests/unit/test_readme_results.py`
checks README's tables against those files).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def _commit() -> str | None:
    """HEAD of the checkout, "+dirty" when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=CHECKOUT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores"
        + (f", load average {load:.1f} at the end" if load is not None else "")
        + f", Python {platform.python_version()}"
    )


def command_line(argv: list[str], main_module: str | None) -> str:
    """The command a user typed: `python -m MODULE ARGS` when the program ran as a module (its
    argv[0] is then the module's file path), else the program's name and its arguments."""
    if main_module:
        return " ".join(["python -m " + main_module.removesuffix(".__main__"), *argv[1:]])
    return " ".join([Path(argv[0]).name, *argv[1:]])


def provenance(command: str | None = None) -> dict:
    """{"command", "commit", "machine", "date"} of the current run (command: this process's)."""
    if command is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        command = command_line(sys.argv, spec.name if spec is not None else None)
    return {
        "command": command,
        "commit": _commit(),
        "machine": machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
    }


def emit_result(doc: dict, out: str | None) -> None:
    """A script's result document: printed, and written to `out` when one is given (docs/results/)."""
    text = json.dumps(doc, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
