"""The Ray Train worker loop: the frozen target's features online, the heads' loss, DDP, checkpoints.

Each worker loads the frozen target (`longgen.target.Target` over the HF model: the pre-norm hidden
states the heads read), builds fresh heads (`heads_for`, float32) and wraps them in DDP (gloo on CPU,
NCCL on GPU). Per step it takes `batch_size` traces from its shard, runs the target over them once
(`collect_features`, no gradients), draws `batch_positions` labelled positions and takes one AdamW
step on `heads_loss` (the target's LM head is shared and frozen). Rank 0 writes a checkpoint every
`checkpoint_every` steps and at the end; after a worker failure (FailureConfig) or a driver rerun
with the same run name, `ray.train.get_checkpoint()` returns the latest one and training resumes
from its step (the data order and drawn positions after a resume are not replayed exactly).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import torch

from pipelines.common.train_run import STATE, event, load_state, say, start_worker
from pipelines.train_heads.batch import pick_positions, sequences
from pipelines.train_heads.config import TrainHeadsConfig
from specexit_core.longgen.heads import heads_for, save_heads
from specexit_core.longgen.target import Target
from specexit_core.longgen.train_heads import collect_features, heads_loss, lr_at

HEADS_SUBDIR = "heads"


def autocast_for(cfg: TrainHeadsConfig, device: torch.device):
    """float32 heads over a float32 target need none; over a bf16 / fp16 target the shared LM head
    runs in the target's dtype under autocast (the heads' weights and optimizer state stay float32)."""
    if cfg.target_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, cfg.target_dtype))


def frozen_target(model) -> Target:
    """The target as the heads see it, with no parameter that could train (its LM head is shared)."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return Target(model)


def _save(heads, opt, step: int):
    from ray.train import Checkpoint

    d = tempfile.mkdtemp(prefix="specexit-heads-ckpt-")
    torch.save({"heads": heads.state_dict(), "optimizer": opt.state_dict(), "step": step}, os.path.join(d, STATE))
    save_heads(heads, os.path.join(d, HEADS_SUBDIR))
    return d, Checkpoint.from_directory(d)


def train_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch
    from transformers import AutoModelForCausalLM

    cfg = TrainHeadsConfig.model_validate(config["cfg"])
    rank, world, device = start_worker(config, cfg.threads_per_worker, cfg.seed)

    model = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=getattr(torch, cfg.target_dtype))
    target = frozen_target(model.to(device))
    heads = heads_for(target, cfg.num_heads).float().train()
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)

    step = 0
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = load_state(os.path.join(d, STATE), device)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    if rank == 0:
        event(config.get("events"), event="start", step=step, world_size=world, resumed=ckpt is not None)
        say(
            f"[heads] rank 0/{world}: {'resuming from step ' + str(step) if ckpt else 'starting'}; "
            f"{cfg.num_heads} heads, {sum(p.numel() for p in heads.parameters()) / 1e6:.2f}M trainable params; "
            f"target frozen ({cfg.target_dtype}); device {device}"
        )

    model_ddp = ray.train.torch.prepare_model(heads)
    inner = model_ddp.module if hasattr(model_ddp, "module") else model_ddp
    # Positions drawn per rank and, after a resume, not the ones drawn before it.
    g = torch.Generator().manual_seed(cfg.seed + 7919 * rank + 104729 * step)
    shard = ray.train.get_dataset_shard("train")
    t0, epoch = time.time(), 0
    t_data = t_step = 0.0  # target forwards (features) vs the heads' step, logged with the loss
    while step < cfg.steps:
        n_batches = 0
        for nb in shard.iter_batches(
            batch_size=cfg.batch_size,
            batch_format="numpy",
            local_shuffle_buffer_size=4 * cfg.batch_size,
            local_shuffle_seed=cfg.seed + 1000 * epoch + step,
        ):
            if step >= cfg.steps:
                break
            n_batches += 1
            t_mark = time.time()
            seqs = sequences(nb["prompt_token_ids"], nb["completion_token_ids"], cfg.max_seq_len)
            feats, labels = collect_features(target, seqs, cfg.num_heads)
            idx = pick_positions(labels, cfg.batch_positions, g)  # labels live on the CPU
            t_data += time.time() - t_mark
            t_mark = time.time()
            for group in opt.param_groups:
                group["lr"] = lr_at(cfg, step)
            with autocast_for(cfg, device):
                loss = heads_loss(
                    model_ddp, target.lm_head, feats[idx.to(feats.device)], labels[:, idx].to(feats.device)
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            t_step += time.time() - t_mark
            step += 1
            is_log = step % cfg.log_every == 0 or step == 1 or step == cfg.steps
            is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
            if not (is_log or is_ckpt):
                continue
            metrics = {
                "step": step,
                "loss": float(loss.detach()),
                "lr": lr_at(cfg, step - 1),
                "positions": int(idx.numel()),
                "epoch": epoch,
                "seconds": round(time.time() - t0, 1),
                "features_s": round(t_data, 2),
                "compute_s": round(t_step, 2),
            }
            if rank == 0 and is_log:
                say(
                    f"[heads] step {step}/{cfg.steps} loss={metrics['loss']:.4f} lr={metrics['lr']:.2e} "
                    f"positions={metrics['positions']} ({metrics['seconds']:.0f}s; features {t_data:.1f}s, "
                    f"heads {t_step:.1f}s)"
                )
            tmp, ck = _save(inner, opt, step) if (is_ckpt and rank == 0) else (None, None)
            ray.train.report(metrics, checkpoint=ck)  # a collective: every rank reports at the same steps
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
                event(config.get("events"), event="checkpoint", step=step)
        if n_batches == 0:
            raise RuntimeError(f"rank {rank}: empty data shard; need at least {world} trace rows")
        epoch += 1
    if rank == 0:
        event(config.get("events"), event="end", step=step)
