"""docs/runbook.md's shell commands, as the tests run them: the ```bash blocks, continuation lines
joined, comments dropped; the `ray job submit` lines among them and their entrypoints."""

from __future__ import annotations

import re
import shlex

from support.paths import REPO_ROOT

RUNBOOK = REPO_ROOT / "docs" / "runbook.md"


def shell_commands(markdown: str) -> list[str]:
    """Commands of the ```bash blocks, continuation lines joined, comments dropped."""
    cmds = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", markdown, re.S):
        cur = ""
        for line in block.splitlines():
            if not cur and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.rstrip().endswith("\\"):
                cur += line.rstrip()[:-1] + " "
                continue
            cur += line
            cmds.append(cur.strip())
            cur = ""
    return cmds


def job_commands() -> list[str]:
    """The runbook's `ray job submit` lines, in order: the smoke job, then traces, labels, draft."""
    return [c for c in shell_commands(RUNBOOK.read_text()) if c.startswith("ray job submit")]


def entrypoint(cmd: str) -> list[str]:
    words = shlex.split(cmd)
    return words[words.index("--") + 1 :]


def stage_of(cmd: str) -> str | None:
    """`traces` for `... -- python -m pipelines.traces ...`; None for a command that runs no stage."""
    ep = entrypoint(cmd)
    return ep[2].split(".")[1] if ep[:2] == ["python", "-m"] else None
