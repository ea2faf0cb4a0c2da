"""EAGLE-3 training-time-test (TTT) token loss + SpecExit signal regression + dynamic weighting.

TTT (index t, unroll step j): the draft sees token x_{t+j+1} and a hidden state -- the target's
fused features at j = 0, its own pre-norm output of step j-1 afterwards -- at RoPE position t+j,
and must predict x_{t+j+2}, i.e. match the target's distribution at position t+j+1 restricted to
the draft vocab. Its attention sees what it would see at inference: step-0 keys of indices <= t
(real target features) plus the keys of steps 1..j at index t (its own earlier drafts).
Step j is weighted 0.8^j.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from specexit_core.draft.model import SpecExitDraft


@dataclass(frozen=True)
class LossConfig:
    unroll: int = 7
    step_decay: float = 0.8
    weighting: str = "uncertainty"  # "uncertainty" (learned log-variances) | "ratio" | "fixed"
    signal_weight: float = 1.0  # for "fixed"

    def __post_init__(self):
        if self.unroll < 1:
            raise ValueError("unroll must be >= 1")
        if self.weighting not in ("uncertainty", "ratio", "fixed"):
            raise ValueError(f"weighting must be uncertainty|ratio|fixed, got {self.weighting!r}")


def ttt_unroll(draft: SpecExitDraft, aux, input_ids, unroll: int):
    """Yields (j, draft-vocab logits [B, n, N] of step j, token position t+j+1 per index [n]).

    Index t runs over 0..T-2. Step j's attention: step-0 keys at indices <= t, plus the keys of
    steps 1..j at index t -- exactly the cache the draft sees at inference after j drafted tokens.
    """
    b, t_len = input_ids.shape
    n = t_len - 1
    if n < 1:
        raise ValueError("sequences must have at least 2 tokens")
    dev = input_ids.device
    idx = torch.arange(n, device=dev)
    hidden, _ = draft.fuse(aux[:, :n])
    causal = idx[None, :] <= idx[:, None]  # [query, key]
    scale = 1.0 / math.sqrt(draft.cfg.head_dim)
    k0 = v0 = None
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    for j in range(min(unroll, n)):
        tok_pos = idx + j + 1  # token fed at index t: x_{t+j+1}
        step_ids = input_ids[:, tok_pos.clamp(max=t_len - 1)]
        pos = (idx + j)[None].expand(b, n)
        q, k, v, res = draft.pre_attn(step_ids, hidden, pos)
        if j == 0:
            k0, v0 = k, v
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        else:
            diag_k.append(k)
            diag_v.append(v)
            s0 = ((q @ k0.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf"))
            sd = [(q * kd).sum(-1, keepdim=True) * scale for kd in diag_k]
            w = torch.softmax(torch.cat([s0] + sd, -1), -1)
            o = w[..., :n] @ v0
            for i, vd in enumerate(diag_v):
                o = o + w[..., n + i : n + i + 1] * vd
        logits, hidden = draft.post_attn(o, res)
        yield j, logits, tok_pos


def ttt_token_loss(draft: SpecExitDraft, aux, input_ids, target_logits, loss_mask, cfg: LossConfig):
    """Returns (weighted loss, {acc_j, loss_j}).

    aux [B,T,3H]; input_ids [B,T]; target_logits [B,T,V] or already restricted to the draft vocab
    [B,T,draft_vocab_size] (`target_features(..., vocab_rows=...)`); loss_mask [B,T] (1 where the token at
    that position is one we want drafted, e.g. completion tokens). Step j at index t predicts
    x_{t+j+2}: its target is the target's distribution at position t+j+1, restricted to the draft
    vocab (softmax over those logits, as EAGLE-3 does).
    """
    t_len = input_ids.shape[1]
    draft_targets = torch.arange(draft.cfg.draft_vocab_size, device=input_ids.device) + draft.d2t
    if target_logits.shape[-1] == draft.cfg.draft_vocab_size:
        draft_targets = slice(None)  # already the draft vocab's columns
    total = torch.zeros((), device=input_ids.device)
    weight_sum = 0.0
    metrics: dict[str, float] = {}
    for j, logits, tok_pos in ttt_unroll(draft, aux, input_ids, cfg.unroll):
        pred_pos = tok_pos + 1
        valid = pred_pos < t_len
        tgt_p = torch.softmax(target_logits[:, tok_pos.clamp(max=t_len - 1)][..., draft_targets], -1)
        m = loss_mask[:, pred_pos.clamp(max=t_len - 1)].float() * valid[None].float()
        ce = -(tgt_p * torch.log_softmax(logits.float(), -1)).sum(-1)
        denom = m.sum().clamp(min=1.0)
        step_loss = (ce * m).sum() / denom
        wj = cfg.step_decay ** j
        total = total + wj * step_loss
        weight_sum += wj
        with torch.no_grad():
            agree = (logits.argmax(-1) == tgt_p.argmax(-1)).float()
            metrics[f"acc_{j}"] = float((agree * m).sum() / denom)
            metrics[f"loss_{j}"] = float(step_loss)
    return total / weight_sum, metrics


def signal_losses(raw: torch.Tensor, conf, prog, log_rem, mask) -> dict[str, torch.Tensor]:
    """raw [B,T,3] fc signal rows; labels [B,T]; mask [B,T] bool (think tokens)."""
    m = mask.float()
    denom = m.sum().clamp(min=1.0)
    bce = F.binary_cross_entropy_with_logits
    return {
        "confidence": (bce(raw[..., 0], conf, reduction="none") * m).sum() / denom,
        "progress": (bce(raw[..., 1], prog, reduction="none") * m).sum() / denom,
        "remaining": (((raw[..., 2] - log_rem) ** 2) * m).sum() / denom,
    }


class DynamicWeighting(nn.Module):
    """Balances the signal terms against the token loss.

    - uncertainty: L = L_tok + sum_k exp(-s_k) L_k + s_k, with learned s_k (Kendall et al. 2018);
    - ratio: each signal term is rescaled to the token loss' current magnitude (no gradient
      through the scale), so no term dominates whatever its units;
    - fixed: L = L_tok + w * sum_k L_k.
    """

    def __init__(self, cfg: LossConfig, names=("confidence", "progress", "remaining")):
        super().__init__()
        self.cfg = cfg
        self.names = tuple(names)
        self.log_vars = nn.Parameter(torch.zeros(len(self.names)))

    def forward(self, token_loss: torch.Tensor, sig: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        logs = {}
        total = token_loss
        for i, k in enumerate(self.names):
            if k not in sig:
                continue
            if self.cfg.weighting == "uncertainty":
                w = torch.exp(-self.log_vars[i])
                total = total + w * sig[k] + self.log_vars[i]
            elif self.cfg.weighting == "ratio":
                w = (token_loss.detach() / sig[k].detach().clamp(min=1e-6)).clamp(max=100.0)
                total = total + w * sig[k]
            else:
                w = torch.tensor(self.cfg.signal_weight)
                total = total + w * sig[k]
            logs[f"w_{k}"] = float(w.detach())
        return total, logs
