"""`python -m pipelines.train_draft.memory CONFIG [--seq-len N] [--device cuda|cpu] [--json]`:
the estimated peak memory of one training worker of a train_draft recipe.

An estimate from shapes (`specexit_core.training.memory`), not a measurement: the runbook's
measured numbers come from `scripts/gpu_train_probe.py`. Needs no GPU and no download for the
shipped recipes (their targets' configs are in `specexit_core.training.known_targets`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipelines.train_draft.config import TrainDraftConfig
from pipelines.train_draft.loop import auto_on_gpu, default_aux_layers
from specexit_core.draft.checkpoint import read_config
from specexit_core.draft.config import DraftConfig
from specexit_core.training.known_targets import target_config
from specexit_core.training.loss import LossConfig
from specexit_core.training.memory import GB, TargetShape, TrainShape, estimate_train_memory
from specexit_core.typed_config import load_config

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def recipe_shape(cfg: TrainDraftConfig, *, device_type: str, seq_len: int | None = None) -> TrainShape:
    """The shape one worker of `cfg` trains at on `device_type` ("cuda" or "cpu"). Sequence length:
    `seq_len`, else the recipe's `max_seq_len`, else the target's maximum positions (an upper bound)."""
    tcfg = target_config(cfg.target)
    if cfg.init_draft and Path(cfg.init_draft, "config.json").exists():
        dcfg = read_config(cfg.init_draft, target_num_layers=tcfg.num_hidden_layers)  # a head may name no aux layers
    elif cfg.draft_vocab_size is not None:
        dcfg = DraftConfig.for_target(
            tcfg,
            aux_layer_ids=cfg.aux_layer_ids or default_aux_layers(tcfg.num_hidden_layers),
            draft_vocab_size=cfg.draft_vocab_size,
            layer=cfg.layer,
        )
    else:
        raise SystemExit(f"memory: init_draft {cfg.init_draft} has no config.json and no draft_vocab_size is set")
    return TrainShape(
        target=TargetShape.from_hf(tcfg),
        draft=dcfg,
        batch_size=cfg.batch_size,
        seq_len=seq_len or cfg.max_seq_len or tcfg.max_position_embeddings,
        unroll=cfg.unroll,
        target_dtype_bytes=DTYPE_BYTES[cfg.target_dtype],
        autocast=auto_on_gpu(cfg.bf16_autocast, device_type),
        recompute=auto_on_gpu(cfg.recompute, device_type),
        world_size=cfg.num_workers,
        loss_chunk_tokens=LossConfig().loss_chunk_tokens,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.train_draft.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="a train_draft YAML (e.g. examples/gpu/train_draft.yaml)")
    ap.add_argument("--seq-len", type=int, help="tokens per row (default: the recipe's max_seq_len)")
    ap.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda unless the recipe sets use_gpu: false")
    ap.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    args = ap.parse_args(argv)
    cfg = load_config(TrainDraftConfig, args.config, what="train_draft")
    device = args.device or ("cpu" if cfg.use_gpu is False else "cuda")
    shape = recipe_shape(cfg, device_type=device, seq_len=args.seq_len)
    est = estimate_train_memory(shape)
    if args.json:
        print(
            json.dumps(
                {
                    "config": args.config,
                    "device": device,
                    "batch_size": shape.batch_size,
                    "seq_len": shape.seq_len,
                    "autocast": shape.autocast,
                    "recompute": shape.recompute,
                    **est.as_json(),
                }
            )
        )
        return 0
    print(
        f"{args.config}: {cfg.target}, {cfg.num_workers} worker(s) x batch {shape.batch_size} x {shape.seq_len} "
        f"tokens, unroll {shape.unroll}, {device} (bf16 autocast {shape.autocast}, recompute {shape.recompute})"
    )
    if not (args.seq_len or cfg.max_seq_len):
        print("  (no max_seq_len: rows as long as the target's maximum positions, an upper bound)")
    print(f"estimated peak per worker: {est.peak / GB:.2f} GB, in the {est.phase} phase (an estimate, not measured)")
    print("  phases: " + ", ".join(f"{k} {v / GB:.2f}" for k, v in est.phases.items()) + " GB")
    print("  terms (each phase adds up some of them, see specexit_core/training/memory.py):")
    for k, v in est.parts.items():
        if v:
            print(f"    {k:24s} {v / GB:8.3f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
