"""The built-in teachers' training loop (`specexit toy build`, `specexit teacher build NAME`):
AdamW with weight decay on matrices only, linear warm-up then cosine decay, gradient clipping,
optional bf16 autocast, a progress line every `log_every` steps.

`TrainRecipe` holds the fields read here; each teacher's build config extends it (model shape, data
style) and sets its own defaults.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Self

import torch
from pydantic import ConfigDict

from specexit_core.typed_config import StrictModel, load_config

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # input_ids, labels, attention_mask


class TrainRecipe(StrictModel):
    """The optimisation part of a teacher's build recipe. Frozen: one recipe per build; saved as
    `build_config.json` next to the weights (`to_json`), read back with unknown keys refused."""

    model_config = ConfigDict(frozen=True)

    seed: int = 0
    steps: int = 1000
    batch_size: int = 64
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    threads: int = 2
    # Off by default: float32 is right on every CPU. bf16 autocast trained the teachers' 3.4M-parameter
    # models 2x faster on a CPU with native bf16 (~10k tokens/s), but on one with AVX2 only (no AVX-512)
    # it is emulated: 144 tokens/s against float32's ~5,000 (`warn_if_bf16_is_emulated`)
    bf16_autocast: bool = False
    log_every: int = 50

    def to_json(self) -> dict:
        return self.model_dump()

    @classmethod
    def from_json(cls, d: dict) -> Self:
        """Raises ConfigError (a ValueError) naming unknown keys, nested ones too."""
        return load_config(cls, raw=d)


def warn_if_bf16_is_emulated(cfg: TrainRecipe, log: logging.Logger) -> None:
    """Fast bf16 matmuls on x86 need AVX-512 kernels (BF16 / AMX); below that torch emulates them. Only
    torch's dispatch level is checked (it does not tell AVX-512 with BF16 from without); measured: AVX2."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cfg.bf16_autocast and not cap.startswith("AVX512"):
        log.warning(
            "bf16_autocast on a CPU whose kernels are %s (no AVX-512): bf16 is likely emulated; on an AVX2 "
            "CPU it trained ~35x slower than float32 (set bf16_autocast: false)",
            cap,
        )


def lr_at(cfg: TrainRecipe, step: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def train(
    model: torch.nn.Module,
    batches: Iterable[Batch],
    loss_fn: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    cfg: TrainRecipe,
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
    warn_if_bf16_is_emulated(cfg, log)
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


def save_teacher(model, tok, out_dir) -> Path:
    """A built teacher's folder: bf16 safetensors (a few MB; load in float32 for parity between transformers
    and vLLM), the tokenizer, and a greedy generation config."""
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.config.dtype = torch.bfloat16
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    ).save_pretrained(out_dir)
    return out_dir
