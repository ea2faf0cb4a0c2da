"""Publishing the trained draft: copied to a hidden sibling of `output` with its training record and
swapped in (pipelines/common/publish.py), so a reader sees the whole old draft or the whole new one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipelines.common.publish import replace_dir, staging_dir
from pipelines.common.train_run import RECORD


def export_draft(draft_dir: str | Path, out: str | Path, meta: dict) -> Path:
    """Copy `draft_dir` (a checkpoint's draft) plus `specexit_train.json` (`meta`: the run's summary,
    identity, config and metrics) to `out`."""
    staged = staging_dir(out)
    shutil.copytree(draft_dir, staged)
    (staged / RECORD).write_text(json.dumps(meta, indent=2) + "\n")
    replace_dir(staged, out)
    return Path(out)
