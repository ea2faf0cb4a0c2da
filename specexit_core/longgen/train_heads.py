"""Training the draft heads with the target frozen: the loss and a small in-process trainer.

Self-distillation as in TokenSwift / Medusa: on sequences the target itself wrote, head i learns to predict
the token i + 1 positions after each position from the target's pre-norm hidden state there (the base LM
head predicts the next one). The target runs once per sequence to collect features; only the heads train.
The Ray stage that trains heads at scale (pipelines/train_heads) reuses `HeadTrainConfig`, `collect_features`,
`heads_loss` and `lr_at`; `train_heads` here is the single-process loop the toy demo and tests use.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from pydantic import Field

from specexit_core.longgen.heads import DraftHeads, heads_for
from specexit_core.longgen.target import Target
from specexit_core.typed_config import StrictModel

IGNORE = -100


class HeadTrainConfig(StrictModel):
    num_heads: int = Field(3, ge=1)  # gamma
    steps: int = Field(300, ge=1)
    lr: float = Field(2e-3, gt=0)  # peak; cosine decay to 0 over `steps` (`lr_at`)
    batch_positions: int = Field(2048, ge=1)  # positions per optimizer step
    seed: int = 0


def lr_at(cfg: HeadTrainConfig, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based): cosine from `lr` to 0 over `steps`, a function of
    the step alone so that a resumed run continues the same schedule."""
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(step, cfg.steps) / cfg.steps))


@torch.inference_mode()
def collect_features(target: Target, sequences: list[list[int]], num_heads: int):
    """-> (pre-norm hidden states [N, H], labels [num_heads, N]): label i of position t is seq[t + 2 + i]."""
    feats, labels = [], []
    for seq in sequences:
        cache = target.new_cache(len(seq))
        h = target.forward(seq, list(range(len(seq))), cache)
        ids = torch.tensor(seq + [IGNORE] * (num_heads + 2), device=h.device)
        feats.append(h.float())
        labels.append(torch.stack([ids[2 + i : 2 + i + len(seq)] for i in range(num_heads)]))
    return torch.cat(feats), torch.cat(labels, 1)


def heads_loss(heads: DraftHeads, lm_head, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over heads of each head's cross-entropy (positions without a label ignored)."""
    logits = heads(feats, lm_head)  # [gamma, B, V]
    return torch.stack(
        [F.cross_entropy(logits[i], labels[i], ignore_index=IGNORE) for i in range(logits.shape[0])]
    ).mean()


def train_heads(target: Target, sequences: list[list[int]], cfg: HeadTrainConfig) -> tuple[DraftHeads, dict]:
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    feats, labels = collect_features(target, sequences, cfg.num_heads)
    heads = heads_for(target, cfg.num_heads).float().train()
    lm_head = target.lm_head
    for p in lm_head.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(cfg.seed)
    first = last = None
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        idx = torch.randint(0, feats.shape[0], (cfg.batch_positions,), generator=g).to(feats.device)
        loss = heads_loss(heads, lm_head, feats[idx], labels[:, idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = float(loss.detach())
        first = last if first is None else first
    heads.eval()
    return heads.to(target.dtype), {
        "positions": int(feats.shape[0]),
        "steps": cfg.steps,
        "loss_first": first,
        "loss_last": last,
        "train_s": time.perf_counter() - t0,
    }


@torch.inference_mode()
def head_accuracy(heads: DraftHeads, target: Target, sequences: list[list[int]]) -> list[float]:
    """Top-1 accuracy of each head on held-out sequences (what acceptance can be at most, per depth)."""
    feats, labels = collect_features(target, sequences, heads.cfg.num_heads)
    pred = heads(feats.to(target.dtype), target.lm_head).argmax(-1)
    return [float((pred[i] == labels[i])[labels[i] != IGNORE].float().mean()) for i in range(pred.shape[0])]
