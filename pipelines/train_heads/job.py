"""`python -m pipelines.train_heads --config FILE`: train TokenSwift draft heads with Ray Train.

traces Parquet (the teacher's own outputs: prompt_token_ids + completion_token_ids, Ray Data) ->
`TorchTrainer` (N DDP workers, the loop in loop.py: the target frozen, only the heads train) with
`CheckpointConfig` + `FailureConfig` under <storage_path>/<run_name> -> the latest checkpoint's heads
exported to `output` (config.json + model.safetensors, loaded by `specexit_core.longgen.heads.load_heads`;
config.json's `training` says the target, steps and loss; staged in a sibling folder and swapped in).

Rerunning with the same run name resumes from the latest checkpoint (Ray Train restores the run's
checkpoint state from storage); raise `steps` to train further. `<run>/_run.json` records what the
checkpoints came from (config, target fingerprint, the traces' parts); a rerun with anything else is
refused (pipelines/common/run_identity.py). A rerun of a finished run (its `output` records this run
identity at the configured steps) starts nothing and reports the recorded result.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from pipelines.common.parts import keep_ids, part_files, read_all
from pipelines.common.publish import replace_dir, staging_dir
from pipelines.common.ray_parquet import read_parquet
from pipelines.common.run_identity import check_identity, config_identity, model_fingerprint, write_identity
from pipelines.common.runtime import init_ray, use_gpu
from pipelines.common.train_run import (
    EVENTS,
    RECORD,
    finished_run,
    has_checkpoint,
    parts_fingerprint,
    read_events,
    torch_trainer,
)
from pipelines.train_heads.config import TrainHeadsConfig
from pipelines.train_heads.loop import HEADS_SUBDIR, train_loop
from specexit_core.longgen.heads import CONFIG_NAME, HeadsConfig

log = logging.getLogger("specexit.pipelines.train_heads")

TOKEN_COLUMNS = ["prompt_token_ids", "completion_token_ids"]


def identity(cfg: TrainHeadsConfig, files: list[Path]) -> dict:
    """What the checkpoints of `<storage_path>/<run_name>` depend on (pipelines/common/run_identity.py)."""
    return {
        "stage": "train_heads",
        "config": config_identity(cfg, cfg.RUN_ONLY_KEYS),
        "models": {"target": model_fingerprint(cfg.target)},
        "input": parts_fingerprint(files, cfg.limit),
    }


def trainable_ids(cfg: TrainHeadsConfig) -> tuple[list[str], list[str]]:
    """(input ids after `limit`, the ok ones with at least `min_completion_tokens` completion tokens)."""
    t = read_all(cfg.input, ["id", "status", "num_completion_tokens"])
    rows = list(zip(*(t.column(c).to_pylist() for c in ("id", "status", "num_completion_tokens"))))[: cfg.limit]
    keep = [i for i, s, n in rows if s == "ok" and (n or 0) >= cfg.min_completion_tokens]
    return [r[0] for r in rows], keep


def finished(cfg: TrainHeadsConfig, ident: dict) -> dict | None:
    """The recorded summary when `output` already holds this run's heads at the configured steps."""
    return finished_run(cfg.output, ident, cfg.run_name, cfg.steps)


def export_heads(heads_dir: str | Path, out: str | Path, training: dict, record: dict) -> Path:
    """Copy a checkpoint's heads to `out` with `training` in their config.json and `record` beside them."""
    staged = staging_dir(out)
    shutil.copytree(heads_dir, staged)
    hc = HeadsConfig.model_validate_json((staged / CONFIG_NAME).read_text())
    hc = hc.model_copy(update={"training": training})
    (staged / CONFIG_NAME).write_text(json.dumps(hc.model_dump(mode="json"), indent=2) + "\n")
    (staged / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return replace_dir(staged, out)


def run(cfg: TrainHeadsConfig) -> dict:
    t0 = time.time()
    run_dir = Path(cfg.storage_path) / cfg.run_name
    files = part_files(cfg.input)
    if not files:
        raise SystemExit(f"train_heads: no traces (part-*.parquet) in {cfg.input}")
    ident = identity(cfg, files)
    done = finished(cfg, ident)
    if done is not None:
        log.info("train_heads: %s already holds run %s at step %d; nothing to do", cfg.output, cfg.run_name, cfg.steps)
        return {**done, "skipped": True, "seconds": round(time.time() - t0, 1)}
    # Resuming a run restores its checkpoints: they must come from the same config, target and traces.
    check_identity(run_dir, ident, resuming=has_checkpoint(run_dir), what="train_heads")
    write_identity(run_dir, ident)
    ids, train_ids = trainable_ids(cfg)
    if len(train_ids) < cfg.num_workers:
        raise SystemExit(f"train_heads: {len(train_ids)} usable traces for {cfg.num_workers} workers")
    init_ray(cfg.ray)

    ds = read_parquet(files, columns=["id", *TOKEN_COLUMNS])
    ds = ds.map_batches(keep_ids, fn_kwargs={"ids": train_ids}, batch_format="pyarrow", num_cpus=0.25)
    train_ds = ds.select_columns(TOKEN_COLUMNS)
    if cfg.cache_data:
        train_ds = train_ds.materialize()
    log.info("train_heads: %d usable traces (of %d); target %s frozen", len(train_ids), len(ids), cfg.target)
    events = run_dir / EVENTS
    gpu = use_gpu("auto") if cfg.use_gpu == "auto" else cfg.use_gpu
    trainer = torch_trainer(
        train_loop,
        {"cfg": cfg.model_dump(mode="json"), "run_dir": str(run_dir), "events": str(events)},
        cfg,
        {"train": train_ds},
        gpu,
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"train_heads: run {cfg.run_name} produced no checkpoint")
    metrics = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    starts = [e for e in read_events(events) if e["event"] == "start"]
    summary = {
        "stage": "train_heads",
        "complete": True,
        "output": str(cfg.output),
        "run_name": cfg.run_name,
        "checkpoint": result.checkpoint.path,
        "target": cfg.target,
        "num_heads": cfg.num_heads,
        "step": metrics.get("step"),
        "loss": metrics.get("loss"),
        "input_rows": len(ids),
        "trained_rows": len(train_ids),
        "skipped_rows": len(ids) - len(train_ids),
        "worker_group_starts": len(starts),
        "resumed_from_steps": [e["step"] for e in starts if e.get("resumed")],
        "skipped": False,
        "seconds": round(time.time() - t0, 1),
    }
    training = {
        "target": cfg.target,
        "target_fingerprint": ident["models"]["target"],
        "steps": metrics.get("step"),
        "loss": metrics.get("loss"),
        "trained_rows": len(train_ids),
        "run_name": cfg.run_name,
    }
    record = {"summary": summary, "train_config": cfg.model_dump(mode="json"), "run_identity": ident}
    with result.checkpoint.as_directory() as d:
        export_heads(Path(d) / HEADS_SUBDIR, cfg.output, training, record)
    return summary
