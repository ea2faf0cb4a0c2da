"""Measure draft training at a recipe's real shape on one GPU: peak memory and seconds per step.

    python3 scripts/gpu_train_probe.py [--config RECIPE.yaml ...] [--steps N] [--out probe.json]
    python3 scripts/gpu_train_probe.py --smoke --out /tmp/probe.json        # CPU, tiny shapes

For each recipe (default: the two shipped GPU recipes) it builds the target from its architecture
config with random weights (bf16, no download), the SpecExit draft with the recipe's draft vocab
and aux layers, and random full-length token rows at the recipe's batch size and `max_seq_len`;
then it runs the real `train_step` (the one the Ray Train loop runs, without DDP: one worker)
under each variant -- the recipe's GPU default (bf16 autocast + per-step recompute) and without
recompute -- and writes, per variant: `torch.cuda.max_memory_allocated` / `max_memory_reserved`
over the timed steps, seconds per step (and of the target's forward alone), and the estimate of
`specexit_core.training.memory` beside it. Random weights change neither: same kernels, same
shapes. A variant that runs out of memory is recorded as such and the next one runs.

Needs PyTorch and transformers only (no vLLM, no Ray, no network) plus this checkout's pure-Python
dependencies; on the lent H200 image pydantic is missing: carry its wheels (see docs/runbook.md,
"Draft training memory and time"). About 3 minutes on one H200 for both recipes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402

from specexit_core.draft.config import DraftConfig  # noqa: E402
from specexit_core.training.known_targets import KNOWN_TARGETS  # noqa: E402
from specexit_core.training.live_bytes import LiveTensorBytes  # noqa: E402
from specexit_core.training.loss import LossConfig  # noqa: E402
from specexit_core.training.memory import TargetShape, TrainShape, estimate_train_memory  # noqa: E402
from specexit_core.training.step import SpecExitObjective, train_step  # noqa: E402
from specexit_core.training.synthetic import random_batch, random_draft, random_target  # noqa: E402

RECIPES = ["examples/gpu/train_draft.yaml", "examples/gpu/deepseek-r1-8b/train_draft.yaml"]
VARIANTS = {"bf16-recompute": dict(autocast=True, recompute=True), "bf16": dict(autocast=True, recompute=False)}
DEFAULT_VARIANT = "bf16-recompute"  # what a recipe trains with on GPUs (bf16_autocast / recompute: auto)
SMOKE_VARIANTS = {"fp32-recompute": dict(autocast=False, recompute=True), "fp32": dict(autocast=False, recompute=False)}
# --smoke: a Qwen3-style target small enough for a CPU unit test (fp32: bf16 matmuls are slow on CPU)
SMOKE_TARGET = dict(
    model_type="qwen3",
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=160,
    vocab_size=1000,
    tie_word_embeddings=True,
    max_position_embeddings=256,
)


def step_tflops(s: TrainShape) -> float:
    """Matmul TFLOPs of one training step (forward, backward, recomputation), approximate: the
    target's forward, and per unroll step the draft layer, its attention and the LM head."""
    t, dc = s.target, s.draft
    n, seq = s.batch_size * s.seq_len, s.seq_len
    h, qd, kd, vd = (
        dc.hidden_size,
        dc.num_attention_heads * dc.head_dim,
        dc.num_key_value_heads * dc.head_dim,
        dc.draft_vocab_size,
    )
    target = 2 * n * (t.params - t.vocab * t.hidden + vd * t.hidden) + t.layers * 2 * n * seq * t.heads * t.head_dim
    layer = 2 * n * (2 * h * (qd + 2 * kd) + qd * h + 3 * h * dc.intermediate_size)
    causal = 2 * n * seq * qd  # one causal attention forward: QK^T and PV, half the square each
    passes = 3 + int(s.recompute)  # forward, backward (2x), recomputation
    draft = 2 * n * 3 * dc.target_hidden_size * dc.fc_out * 3
    for j in range(s.unroll):
        draft += passes * layer + (1 if j == 0 else 2) * causal * (1 + 2.5 + int(s.recompute))
        draft += 4 * 2 * n * h * vd  # LM head: forward, recomputed in backward, backward (2x)
    return (target + draft) / 1e12


def shape_of(recipe: str) -> tuple[TrainShape, str, dict]:
    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.memory import recipe_shape
    from specexit_core.typed_config import load_config

    cfg = load_config(TrainDraftConfig, ROOT / recipe, what="train_draft")
    if cfg.target not in KNOWN_TARGETS:
        raise SystemExit(f"{recipe}: target {cfg.target} has no config in specexit_core/training/known_targets.py")
    return (
        recipe_shape(cfg, device_type="cuda"),
        cfg.target,
        {"weighting": cfg.weighting, "world_size": cfg.num_workers},
    )


def run_variant(target, draft, shape: TrainShape, batch, *, weighting: str, warmup: int, steps: int, device) -> dict:
    """Warm-up steps (AdamW's moments appear at the first), then `steps` timed ones; peak memory
    over the timed steps (CUDA) or of one step plus the static tensors (CPU)."""
    objective = SpecExitObjective(
        draft, LossConfig(unroll=shape.unroll, weighting=weighting, recompute=shape.recompute)
    )
    opt = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95))
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        train_step(objective, opt, target, batch, autocast=shape.autocast)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, live = [], LiveTensorBytes() if not cuda else None
    for _ in range(steps):
        t0 = time.perf_counter()
        if live is not None:
            with live:
                train_step(objective, opt, target, batch, autocast=shape.autocast)
        else:
            train_step(objective, opt, target, batch, autocast=shape.autocast)
        sync()
        times.append(time.perf_counter() - t0)
    out = {"step_seconds": [round(x, 4) for x in times], "seconds_per_step": round(sum(times) / len(times), 4)}
    if cuda:
        out.update(
            peak_allocated_bytes=torch.cuda.max_memory_allocated(), peak_reserved_bytes=torch.cuda.max_memory_reserved()
        )
    else:
        tensors = [
            *target.parameters(),
            *target.buffers(),
            *objective.parameters(),
            *objective.buffers(),
            *(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)),
        ]
        out.update(
            peak_allocated_bytes=live.peak + sum(t.numel() * t.element_size() for t in tensors),
            peak_reserved_bytes=None,
        )
    del objective, opt
    return out


def target_seconds(target, draft, batch, device) -> float:
    """The frozen target's forward alone (features for one batch), mean of two calls."""
    from specexit_core.training.features import target_features

    rows = torch.arange(draft.cfg.draft_vocab_size, device=device) + draft.d2t
    ts = []
    for _ in range(2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        target_features(
            target, batch.input_ids, batch.attention_mask, draft.cfg.aux_layer_ids, vocab_rows=rows, out_dtype=None
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return round(sum(ts) / len(ts), 4)


def probe(
    name: str,
    hf_config: dict,
    base: TrainShape,
    *,
    dtype,
    device,
    variants: dict[str, dict],
    warmup: int,
    steps: int,
    weighting: str,
    recipe_world: int,
    also_seq_lens: tuple[int, ...] = (),
    on_row=lambda res: None,
) -> dict:
    """One recipe: build its target, draft and batch, run every variant at the recipe's sequence
    length, then the default variant at `also_seq_lens` (time at typical lengths). `base` gives the
    batch size, sequence length, unroll, draft vocab and aux layers. `on_row(res)` after each variant (the
    caller rewrites its JSON: a run cut short keeps what it measured)."""
    target = random_target(hf_config, dtype=dtype, device=device)
    draft = random_draft(
        target, aux_layer_ids=base.draft.aux_layer_ids, draft_vocab_size=base.draft.draft_vocab_size, device=device
    )
    shape = dataclasses.replace(
        base,
        target=TargetShape.from_hf(target.config),
        draft=draft.cfg,
        world_size=1,
        target_dtype_bytes=dtype.itemsize,
    )
    batch = random_batch(shape.batch_size, shape.seq_len, hf_config["vocab_size"], device=device)
    res = {
        "recipe": name,
        "batch_size": shape.batch_size,
        "seq_len": shape.seq_len,
        "unroll": shape.unroll,
        "draft_vocab_size": shape.draft.draft_vocab_size,
        "aux_layer_ids": list(shape.draft.aux_layer_ids),
        "target_forward_seconds": target_seconds(target, draft, batch, device),
        "variants": {},
    }
    runs = [(vname, dataclasses.replace(shape, **flags)) for vname, flags in variants.items()]
    runs += [
        (f"{DEFAULT_VARIANT}@{n}", dataclasses.replace(shape, seq_len=n, **VARIANTS[DEFAULT_VARIANT]))
        for n in also_seq_lens
        if n != shape.seq_len
    ]
    for vname, vs in runs:
        flags = {"autocast": vs.autocast, "recompute": vs.recompute, "seq_len": vs.seq_len}
        if vs.seq_len != shape.seq_len:
            batch = random_batch(vs.batch_size, vs.seq_len, hf_config["vocab_size"], device=device)
        est = estimate_train_memory(vs)
        row = {
            **flags,
            "estimated_peak_bytes": est.peak,
            "estimated_phase": est.phase,
            "estimated_phases": est.phases,
            "estimated_peak_bytes_at_recipe_world_size": estimate_train_memory(
                dataclasses.replace(vs, world_size=recipe_world)
            ).peak,
            "model_tflops_per_step": round(step_tflops(vs), 6),
        }
        try:
            row.update(
                run_variant(target, draft, vs, batch, weighting=weighting, warmup=warmup, steps=steps, device=device)
            )
            row["measured_over_estimated"] = round(row["peak_allocated_bytes"] / est.peak, 3)
            row["achieved_tflops"] = round(row["model_tflops_per_step"] / row["seconds_per_step"], 6)
        except torch.cuda.OutOfMemoryError as e:
            row.update(oom=True, error=str(e).splitlines()[0])
        except Exception as e:  # a lent machine's minutes are few: record it, measure the rest
            row.update(error=f"{type(e).__name__}: {e}"[:2000])
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        res["variants"][vname] = row
        on_row(res)
        print(json.dumps({name: {vname: {k: v for k, v in row.items() if k != "estimated_phases"}}}), flush=True)
    del target, draft, batch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", help=f"train_draft recipe (repeatable; default: {' '.join(RECIPES)})")
    ap.add_argument("--variant", action="append", choices=list(VARIANTS), help="default: all (GPU)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per variant")
    ap.add_argument(
        "--also-seq-len",
        type=int,
        action="append",
        help="also time the default variant at this many tokens per row (default: 2048, about a "
        "GSM8K reasoning trace; the recipes' max_seq_len is the memory worst case)",
    )
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, measures nothing real")
    ap.add_argument("--out", default="gpu_train_probe.json")
    args = ap.parse_args(argv)
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
    results: list[dict] = []
    out = Path(args.out)

    def write(partial: dict | None = None) -> None:
        out.write_text(
            json.dumps({"environment": env, "results": [*results, *([partial] if partial else [])]}, indent=2) + "\n"
        )

    if args.smoke:
        device = torch.device("cpu")
        env["device"] = "cpu (--smoke)"
        torch.set_num_threads(1)  # tiny matmuls: more threads only contend
        dcfg = DraftConfig.for_target(
            AutoConfig.for_model(**SMOKE_TARGET), aux_layer_ids=(1, 2, 3), draft_vocab_size=250
        )
        base = TrainShape(target=None, draft=dcfg, batch_size=2, seq_len=32, unroll=3, loss_chunk_tokens=32)
        results.append(
            probe(
                "smoke",
                SMOKE_TARGET,
                base,
                dtype=torch.float32,
                device=device,
                variants=SMOKE_VARIANTS,
                warmup=1,
                steps=1,
                weighting="uncertainty",
                recipe_world=1,
                also_seq_lens=(16,),
                on_row=write,
            )
        )
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device (use --smoke on CPU)")
        device = torch.device("cuda")
        env["device"] = torch.cuda.get_device_name(0)
        env["device_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
        variants = {k: VARIANTS[k] for k in args.variant or VARIANTS}
        for recipe in args.config or RECIPES:
            base, target_name, extra = shape_of(recipe)
            results.append(
                probe(
                    recipe,
                    KNOWN_TARGETS[target_name],
                    base,
                    dtype=torch.bfloat16,
                    device=device,
                    variants=variants,
                    warmup=args.warmup,
                    steps=args.steps,
                    weighting=extra["weighting"],
                    recipe_world=extra["world_size"],
                    also_seq_lens=tuple(args.also_seq_len or [2048]),
                    on_row=write,
                )
            )
    write()
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
