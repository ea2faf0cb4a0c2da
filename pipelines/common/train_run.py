"""What the Ray Train stages (train_draft, train_heads) share about one training run under
`<storage_path>/<run_name>`: whether it has checkpoints, the fingerprint of the Parquet parts it
trains on, its event log (worker-group starts, checkpoints, end), the workers' progress lines,
loading a checkpoint's training state safely, a worker's start and the trainer itself. Importable
without Ray (Ray and torch are imported where used)."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

STATE = "state.pt"  # a checkpoint's training state (weights, optimizer, step)
EVENTS = "specexit_events.jsonl"
RECORD = "specexit_train.json"  # beside the exported model: {"summary", "run_identity", ...}


def has_checkpoint(run_dir: str | Path) -> bool:
    run_dir = Path(run_dir)
    return (run_dir / "checkpoint_manager_snapshot.json").exists() or any(run_dir.glob("checkpoint_*"))


def parts_fingerprint(files: list[Path], limit: int | None) -> dict:
    """The Parquet parts a run trains on (named by their ids, sized by their content)."""
    h = hashlib.sha256("".join(f"{f.name}\0{f.stat().st_size}\n" for f in files).encode())
    return {"parts": len(files), "sha256": h.hexdigest()[:16], "limit": limit}


def finished_run(output: str | Path, ident: dict, run_name: str, steps: int) -> dict | None:
    """The recorded summary when `output` already holds this run (same run identity and name) trained
    to `steps`: a rerun of a finished run then starts nothing (no Ray Train worker group) and reports it."""
    p = Path(output) / RECORD
    if not p.exists():
        return None
    rec = json.loads(p.read_text())
    s = rec.get("summary") or {}
    same = rec.get("run_identity") == json.loads(json.dumps(ident)) and s.get("run_name") == run_name
    return s if same and s.get("step") == steps else None


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


def start_worker(config: dict, threads: int, seed: int):
    """A Ray Train worker's first lines: its pid under `config["run_dir"]` (lets an operator, or a
    failure test, find and kill a worker), its device, torch threads on CPU, the seed.
    -> (rank, world size, device)."""
    import os

    import ray.train
    import ray.train.torch
    import torch

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    run_dir = config.get("run_dir")
    if run_dir:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        Path(run_dir, f"worker-{rank}.pid").write_text(str(os.getpid()))
    device = ray.train.torch.get_device()
    if device.type == "cpu":
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    return rank, world, device


def torch_trainer(loop, loop_config: dict, cfg, datasets: dict, gpu: bool):
    """The stage's `TorchTrainer`: `cfg.num_workers` DDP workers (1 CPU each without GPUs),
    checkpoints under `<cfg.storage_path>/<cfg.run_name>` (the last `num_to_keep`), and
    `max_failures` worker-group restarts from the last checkpoint. `cfg`: a `TrainRunBase`."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    return TorchTrainer(
        loop,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=cfg.num_workers,
            use_gpu=gpu,
            resources_per_worker=None if gpu else {"CPU": 1},
            placement_strategy=cfg.placement_strategy,
        ),
        datasets=datasets,
        run_config=RunConfig(
            name=cfg.run_name,
            storage_path=cfg.storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.num_to_keep),
            failure_config=FailureConfig(max_failures=cfg.max_failures),
        ),
    )
