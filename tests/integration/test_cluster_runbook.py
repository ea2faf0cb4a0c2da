"""docs/runbook.md's `ray job submit` commands: they are the three pipeline stages, every GPU setting
lives in the configs (`$CONFIGS/<stage>.yaml`), and the recipes the runbook points `$CONFIGS` at
have those files.

The commands are also *run as written* in CI (bash, `RAY_ADDRESS` exported, `$CONFIGS` set), against
a local Ray cluster with toy configs: `test_pipelines_jobs.py::test_runbook_job_commands_resume_the_chain`,
which reuses that module's cluster and finished chain instead of building a second one.
"""

from __future__ import annotations

import re

from support.paths import REPO_ROOT
from support.runbook import RUNBOOK, entrypoint, job_commands, stage_of


def test_runbook_job_commands_are_the_pipeline_stages():
    cmds = job_commands()
    assert [stage_of(c) for c in cmds if stage_of(c)] == ["traces", "labels", "train_draft"], cmds
    for c in cmds:
        ep = entrypoint(c)
        assert "--address" not in c  # RAY_ADDRESS, exported once in the runbook
        if stage_of(c):
            assert ep[:3] == ["python", "-m", f"pipelines.{stage_of(c)}"], c  # python -m pipelines.<stage>
            # every GPU-only setting lives in the config: the only argument is the config file
            assert ep[3:] == ["--config", f"$CONFIGS/{stage_of(c)}.yaml"], c
            assert "--working-dir ." in c
    # and the recipes the runbook points $CONFIGS at have those files
    for folder in re.findall(r"CONFIGS=(\S+)", RUNBOOK.read_text()):
        for stage in ("traces", "labels", "train_draft"):
            assert (REPO_ROOT / folder / f"{stage}.yaml").exists(), (folder, stage)
