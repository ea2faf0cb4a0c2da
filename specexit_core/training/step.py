"""One training step, shared by the single-process trainer and the Ray Train job.

`SpecExitObjective` wraps draft + dynamic weighting in one `nn.Module` whose `forward` returns the
total loss, so DistributedDataParallel can wrap it (DDP only syncs gradients through `forward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from specexit_core.draft.model import SpecExitDraft
from specexit_core.training.features import target_features
from specexit_core.training.loss import DynamicWeighting, LossConfig, signal_losses, ttt_token_loss


@dataclass
class DraftBatch:
    input_ids: torch.Tensor  # [B, T] prompt + completion, right-padded
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T] 1 on completion tokens (the ones worth drafting)
    confidence: torch.Tensor  # [B, T] signal labels (0 outside think)
    progress: torch.Tensor
    log_remaining: torch.Tensor
    think_mask: torch.Tensor  # [B, T] bool


class SpecExitObjective(nn.Module):
    def __init__(self, draft: SpecExitDraft, cfg: LossConfig):
        super().__init__()
        self.draft = draft
        self.cfg = cfg
        self.weighting = DynamicWeighting(cfg)

    def forward(self, aux, target_logits, batch: DraftBatch):
        hidden, raw = self.draft.fuse(aux)  # one fc pass feeds both the token and the signal losses
        tok_loss, metrics = ttt_token_loss(
            self.draft,
            aux,
            batch.input_ids,
            target_logits,
            batch.loss_mask * batch.attention_mask,
            self.cfg,
            hidden=hidden,
        )
        logs = {"token_loss": tok_loss.item(), **metrics}
        total = tok_loss
        if self.draft.cfg.signals:
            sig = signal_losses(
                raw,
                batch.confidence,
                batch.progress,
                batch.log_remaining,
                batch.think_mask & batch.attention_mask.bool(),
                end_weight=self.cfg.end_weight,
            )
            total, wlogs = self.weighting(tok_loss, sig)
            logs.update({f"{k}_loss": v.item() for k, v in sig.items()}, **wlogs)
        logs["loss"] = total.item()
        return total, logs


def train_step(
    objective: nn.Module,
    optimizer: torch.optim.Optimizer,
    target,
    batch: DraftBatch,
    *,
    grad_clip: float = 1.0,
    autocast: bool = False,
) -> dict[str, float]:
    """Features from the frozen target, loss, backward, clip, step. Returns the logged terms.

    `objective` is a SpecExitObjective, or DDP around one. `autocast`: the draft's forward runs in
    bf16 autocast (weights, gradients and optimizer state stay fp32) and the target's features stay
    in the target's dtype."""
    inner = objective.module if hasattr(objective, "module") else objective
    draft = inner.draft
    # Gradients go before the forward, so last step's are not alive at the activation peak.
    optimizer.zero_grad(set_to_none=True)
    rows = torch.arange(draft.cfg.draft_vocab_size, device=batch.input_ids.device) + draft.d2t
    aux, logits = target_features(
        target,
        batch.input_ids,
        batch.attention_mask,
        draft.cfg.aux_layer_ids,
        vocab_rows=rows,
        out_dtype=None if autocast else torch.float32,
    )
    objective.train()
    with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        total, logs = objective(aux, logits, batch)
    total.backward()
    logs["grad_norm"] = float(
        torch.nn.utils.clip_grad_norm_([p for p in objective.parameters() if p.requires_grad], grad_clip)
    )
    optimizer.step()
    return logs
