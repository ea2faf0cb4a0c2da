"""The built-in teachers' training loop (`specexit toy build`, `specexit teacher build qwen3-like`):
AdamW with weight decay on matrices only, linear warm-up then cosine decay, gradient clipping,
optional bf16 autocast, a progress line every `log_every` steps.

The recipe object only needs the fields read here (both teachers' build configs have them).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

import torch

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # input_ids, labels, attention_mask


def lr_at(cfg, step: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def train(
    model: torch.nn.Module,
    batches: Iterable[Batch],
    loss_fn: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    cfg,
    log: logging.Logger,
) -> None:
    """`cfg.steps` optimizer steps over `batches`; `loss_fn(model, ids, labels, attention)`."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    model.train()
    t0, seen, run_loss = time.time(), 0, 0.0
    for step, (ids, lab, att) in zip(range(cfg.steps), batches):
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
            loss = loss_fn(model, ids, lab, att)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen += int(att.sum())
        run_loss += loss.item()
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            el = time.time() - t0
            log.info(
                "step %d/%d  loss %.4f  lr %.2e  %.0f tok/s  elapsed %.0fs  eta %.0fs",
                step + 1,
                cfg.steps,
                run_loss / cfg.log_every,
                lr_at(cfg, step),
                seen / el,
                el,
                el / (step + 1) * (cfg.steps - step - 1),
            )
            run_loss = 0.0
