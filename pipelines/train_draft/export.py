"""Publishing the trained draft: copied to a hidden sibling of `output` with its training record and
swapped in (pipelines/common/publish.py), so a reader sees the whole old draft or the whole new one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipelines.common.publish import replace_dir, staging_dir


def export_draft(draft_dir: str | Path, out: str | Path, meta: dict) -> Path:
    """Copy `draft_dir` (a checkpoint's draft) plus `specexit_train.json` (`meta`) to `out`."""
    staged = staging_dir(out)
    shutil.copytree(draft_dir, staged)
    (staged / "specexit_train.json").write_text(json.dumps(meta, indent=2) + "\n")
    replace_dir(staged, out)
    return Path(out)
