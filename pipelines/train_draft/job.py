"""`python -m pipelines.train_draft --config FILE`: train the SpecExit draft with Ray Train.

labels Parquet (Ray Data) -> draft vocab from token counts -> `TorchTrainer` (N DDP workers, the
loop in train_loop.py) with `CheckpointConfig` + `FailureConfig` under
<storage_path>/<run_name> -> export the latest checkpoint's draft folder to `output` (the
vLLM Eagle3 layout written by `specexit_core.draft.checkpoint.save_draft`; staged in a sibling
folder and swapped in, export.py).

Rerunning with the same run name resumes from the latest checkpoint (Ray Train restores the run's
checkpoint state from storage); raise `steps` to train further. `<run>/_run.json` records what the
checkpoints came from (config, target / init draft fingerprints, the labels' parts); a rerun with
anything else is refused (pipelines/common/run_identity.py). A rerun of a finished run (its `output`
records this run identity at the configured steps) starts nothing and reports the recorded result.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from pipelines.common.parts import keep_ids, part_files, read_column
from pipelines.common.ray_parquet import read_parquet
from pipelines.common.run_identity import check_identity, config_identity, model_fingerprint, write_identity
from pipelines.common.runtime import init_ray, use_gpu
from pipelines.common.tokens import load_tokenizer, token_ids
from pipelines.common.train_run import EVENTS, finished_run, has_checkpoint, parts_fingerprint, torch_trainer
from pipelines.common.train_run import read_events as read_run_events
from pipelines.train_draft.config import TrainDraftConfig
from pipelines.train_draft.export import export_draft
from pipelines.train_draft.loop import DRAFT_SUBDIR, train_loop
from pipelines.train_draft.vocab_counts import count_tokens
from specexit_core.draft.vocab import draft_vocab_from_counts

log = logging.getLogger("specexit.pipelines.train_draft")

COLUMNS = [
    "id",
    "status",
    "prompt_token_ids",
    "completion_token_ids",
    "confidence",
    "progress",
    "log_remaining",
    "mask",
]


def events_path(cfg: TrainDraftConfig) -> Path:
    return Path(cfg.storage_path) / cfg.run_name / EVENTS


def read_events(cfg: TrainDraftConfig) -> list[dict]:
    return read_run_events(events_path(cfg))


def exit_vocab(tids, counts) -> tuple[list[int], list[int]]:
    """The tokens the exit needs in the draft vocab: (always: `</think>` and EOS; the paragraph
    breaks the traces use). Only the breaks that occur: a byte-level BPE tokenizer has hundreds
    (Qwen3: 712), more than a small draft vocab holds, and one the teacher never writes is never
    drafted (draft_vocab_from_counts prefers the others' ids, the unused ones come last)."""
    return [tids.think_end, *tids.eos], [int(t) for t in tids.split if counts[t] > 0]


def prepare_init_draft(cfg: TrainDraftConfig, run_dir: Path, must_keep: list[int]):
    """The SpecExit folder training starts from (a stock EAGLE-3 draft gets zero signal rows), and
    its vocab maps. Checks that it fits the target and keeps the tokens the exit needs."""
    import torch

    from specexit_core.draft.checkpoint import convert, read_config
    from specexit_core.draft.for_target import layers_for_head
    from specexit_core.draft.weights import read_tensors

    src = Path(cfg.init_draft)
    layers = layers_for_head(src, cfg.target)  # a published head may name no aux layers: vLLM's default then
    dcfg = read_config(src, target_num_layers=layers)
    if dcfg.signals:
        init = src
    else:
        init = convert(src, run_dir / "init_draft", add_signals=True, target_num_layers=layers)
        log.info("train_draft: %s is a stock EAGLE-3 draft; added zero-initialised signal rows", src)
    if cfg.draft_vocab_size is not None and cfg.draft_vocab_size != dcfg.draft_vocab_size:
        raise SystemExit(
            f"train_draft: draft_vocab_size {cfg.draft_vocab_size} != init_draft's {dcfg.draft_vocab_size}"
        )
    t = read_tensors(init, dcfg)  # safetensors or pytorch_model.bin
    d2t, t2d = t["d2t"].long(), t["t2d"].to(torch.bool)
    missing = [i for i in must_keep if not bool(t2d[i])]
    if missing:
        raise SystemExit(f"train_draft: init_draft's vocab lacks token ids {missing} (</think>, split, eos)")
    return str(init), d2t, t2d


def identity(cfg: TrainDraftConfig, files: list[Path]) -> dict:
    """What the checkpoints of `<storage_path>/<run_name>` depend on (pipelines/common/run_identity.py)."""
    return {
        "stage": "train_draft",
        "config": config_identity(cfg, cfg.RUN_ONLY_KEYS),
        "models": {"target": model_fingerprint(cfg.target), "init_draft": model_fingerprint(cfg.init_draft)},
        "input": parts_fingerprint(files, cfg.limit),
    }


def run(cfg: TrainDraftConfig) -> dict:
    t0 = time.time()
    run_dir = Path(cfg.storage_path) / cfg.run_name
    if not part_files(cfg.input):
        raise SystemExit(f"train_draft: no labels (part-*.parquet) in {cfg.input}")
    ident = identity(cfg, part_files(cfg.input))
    done = finished_run(cfg.output, ident, cfg.run_name, cfg.steps)
    if done is not None:
        log.info("train_draft: %s already holds run %s at step %d; nothing to do", cfg.output, cfg.run_name, cfg.steps)
        return {**done, "skipped": True, "seconds": round(time.time() - t0, 1)}
    # Resuming a run restores its checkpoints: they must come from the same config, models and labels.
    check_identity(run_dir, ident, resuming=has_checkpoint(run_dir), what="train_draft")
    write_identity(run_dir, ident)
    init_ray(cfg.ray)
    from transformers import AutoConfig

    files = part_files(cfg.input)
    ids = read_column(cfg.input, "id")[: cfg.limit]
    status = dict(zip(read_column(cfg.input, "id"), read_column(cfg.input, "status")))
    train_ids = [i for i in ids if status[i] == "ok"]
    if len(train_ids) < cfg.num_workers:
        raise SystemExit(f"train_draft: {len(train_ids)} labeled rows for {cfg.num_workers} workers")
    ds = read_parquet(files, columns=COLUMNS)
    ds = ds.map_batches(keep_ids, fn_kwargs={"ids": train_ids}, batch_format="pyarrow", num_cpus=0.25)

    tcfg = AutoConfig.from_pretrained(cfg.target)
    vocab = tcfg.vocab_size
    tok = load_tokenizer(cfg.target)
    tids = token_ids(
        tok, think_start=cfg.think_start, think_end=cfg.think_end, split_tokens=cfg.split_tokens, model_dir=cfg.target
    )
    counts = np.zeros(vocab, dtype=np.int64)
    for r in ds.map_batches(
        count_tokens,
        fn_kwargs={"column": "completion_token_ids", "vocab_size": vocab},
        batch_format="pyarrow",
        num_cpus=0.25,
    ).iter_rows():
        counts += np.asarray(r["counts"], dtype=np.int64)
    init_dir = None
    always, splits = exit_vocab(tids, counts)
    if cfg.init_draft:
        init_dir, d2t, t2d = prepare_init_draft(cfg, run_dir, [*always, *splits])
    else:
        d2t, t2d = draft_vocab_from_counts(counts, cfg.draft_vocab_size, always, prefer=splits)
    covered = float(counts[t2d.numpy()].sum() / max(counts.sum(), 1))
    log.info(
        "train_draft: %d labeled rows (of %d); draft vocab %d covers %.1f%% of completion tokens%s",
        len(train_ids),
        len(ids),
        int(t2d.sum()),
        100 * covered,
        f"; fine-tuning {cfg.init_draft}" if cfg.init_draft else "",
    )

    train_ds = ds.select_columns(COLUMNS[2:])
    if cfg.cache_data:
        train_ds = train_ds.materialize()
    gpu = use_gpu("auto") if cfg.use_gpu == "auto" else cfg.use_gpu
    trainer = torch_trainer(
        train_loop,
        {
            "cfg": cfg.model_dump(mode="json"),
            "d2t": d2t.tolist(),
            "t2d": t2d.tolist(),
            "pad_id": tids.pad,
            "eos_id": tids.eos[0],
            "run_dir": str(run_dir),
            "token_ids": {"think_start": tids.think_start, "think_end": tids.think_end, "split": list(tids.split)},
            "events": str(events_path(cfg)),
            "init_draft": init_dir,
        },
        cfg,
        {"train": train_ds},
        gpu,
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"train_draft: run {cfg.run_name} produced no checkpoint")
    out = Path(cfg.output)
    metrics = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    starts = [e for e in read_events(cfg) if e["event"] == "start"]
    secs = time.time() - t0
    summary = {
        "stage": "train_draft",
        "complete": True,
        "output": str(out),
        "run_name": cfg.run_name,
        "checkpoint": result.checkpoint.path,
        "step": metrics.get("step"),
        "loss": metrics.get("loss"),
        "input_rows": len(ids),
        "ok": len(train_ids),
        "errors": len(ids) - len(train_ids),
        "worker_group_starts": len(starts),
        "resumed_from_steps": [e["step"] for e in starts if e.get("resumed")],
        "skipped": False,
        "seconds": round(secs, 1),
        "rows_per_s": round(len(train_ids) / secs, 3),
    }
    meta = {
        "summary": summary,
        "train_config": cfg.model_dump(mode="json"),
        "final_metrics": metrics,
        "checkpoint": result.checkpoint.path,
        "draft_vocab_coverage": covered,
        "labeled_rows": len(train_ids),
        "run_identity": ident,
    }
    with result.checkpoint.as_directory() as d:
        export_draft(Path(d) / DRAFT_SUBDIR, out, meta)
    return summary
