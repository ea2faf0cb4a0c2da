"""What the Ray Train tests read from a run's storage folder."""

from __future__ import annotations

import json
from pathlib import Path

# the terms every progress line of the draft training job names (`[train] step N/M ... token_loss=...`)
LOG_TERMS = ("token_loss", "confidence_loss", "progress_loss", "remaining_loss", "acc_0", "w_confidence", "grad_norm")


def registered_checkpoint(run: Path) -> str | None:
    """The checkpoint the Ray Train controller has registered (named in its snapshot on storage), None
    before the first. One a worker reported a moment before a crash may not be registered yet, and the
    run then restarts from the one before."""
    try:
        snap = json.loads((run / "checkpoint_manager_snapshot.json").read_text())
    except (OSError, ValueError):
        return None
    latest = snap.get("latest_checkpoint_result")
    return latest and latest.get("checkpoint_dir_name")
