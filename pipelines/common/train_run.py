"""What the Ray Train stages (train_draft, train_heads) share about one training run under
`<storage_path>/<run_name>`: whether it has checkpoints, the fingerprint of the Parquet parts it
trains on, its event log (worker-group starts, checkpoints, end), the workers' progress lines and
loading a checkpoint's training state safely. Importable without Ray."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

STATE = "state.pt"  # a checkpoint's training state (weights, optimizer, step)
EVENTS = "specexit_events.jsonl"


def has_checkpoint(run_dir: str | Path) -> bool:
    run_dir = Path(run_dir)
    return (run_dir / "checkpoint_manager_snapshot.json").exists() or any(run_dir.glob("checkpoint_*"))


def parts_fingerprint(files: list[Path], limit: int | None) -> dict:
    """The Parquet parts a run trains on (named by their ids, sized by their content)."""
    h = hashlib.sha256("".join(f"{f.name}\0{f.stat().st_size}\n" for f in files).encode())
    return {"parts": len(files), "sha256": h.hexdigest()[:16], "limit": limit}


def read_events(path: str | Path) -> list[dict]:
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def event(path: str | None, **kw) -> None:
    """Append one event (`start` with `resumed` and `step`, `checkpoint`, `end`) to the run's log."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps({"time": round(time.time(), 3), **kw}) + "\n")


def say(msg: str) -> None:
    """One line to the worker's stdout (Ray forwards it to the job log). Ray Train patches
    `print` to also go through its logger, which shows every line twice; write to the real stdout."""
    sys.__stdout__.write(msg + "\n")
    sys.__stdout__.flush()


def load_state(path: str, device) -> dict:
    """A checkpoint's training state (model and optimizer state dicts, step). `weights_only=True`:
    tensors and plain containers only, so a checkpoint folder someone else could write cannot run
    code when it is loaded (torch's full unpickler would)."""
    import torch

    return torch.load(path, map_location=device, weights_only=True)
