"""EAGLE-3 training-time-test (TTT) token loss + SpecExit signal regression + dynamic weighting.

TTT (index t, unroll step j): the draft sees token x_{t+j+1} and a hidden state -- the target's
fused features at j = 0, its own pre-norm output of step j-1 afterwards -- at RoPE position t+j,
and must predict x_{t+j+2}, i.e. match the target's distribution at position t+j+1 restricted to
the draft vocab. Its attention sees what it would see at inference: step-0 keys of indices <= t
(real target features) plus the keys of steps 1..j at index t (its own earlier drafts).
Step j is weighted 0.8^j. The attention runs in fused kernels (`ttt_attention.py`); the draft-vocab
logits exist a chunk of positions at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from specexit_core.draft.model import SpecExitDraft
from specexit_core.training.ttt_attention import ttt_step_attention


@dataclass(frozen=True)
class LossConfig:
    unroll: int = 7
    step_decay: float = 0.8
    weighting: str = "uncertainty"  # "uncertainty" (learned log-variances) | "ratio" | "fixed"
    signal_weight: float = 1.0  # for "fixed"
    # confidence loss weight of the think tokens whose progress label is >= END_FROM, against 1 for the
    # others (1: every think token alike)
    end_weight: float = 1.0
    # Recompute each unroll step's decoder layer during backward instead of keeping its
    # activations: activation memory of about one step instead of `unroll` steps, for one more
    # forward of the draft layer (see specexit_core/training/memory.py).
    recompute: bool = False
    # Draft-vocab logits (with their softmax and log-softmax) exist for this many positions at a
    # time, and are always recomputed in backward (only the chunk's hidden states are kept): over
    # a 32k draft vocab that is 16 bytes x 32k x 2048 = 1 GB per chunk instead of 8 bytes x 32k
    # per token and step for the whole unroll (32 GB at 2 x 8k tokens and 7 steps).
    loss_chunk_tokens: int = 2048

    def __post_init__(self):
        if self.unroll < 1:
            raise ValueError("unroll must be >= 1")
        if self.weighting not in ("uncertainty", "ratio", "fixed"):
            raise ValueError(f"weighting must be uncertainty|ratio|fixed, got {self.weighting!r}")
        if self.loss_chunk_tokens < 1:
            raise ValueError("loss_chunk_tokens must be >= 1")
        if self.end_weight <= 0:
            raise ValueError(f"end_weight must be > 0, got {self.end_weight}")


def _recomputed(fn, *args):
    """fn(*args) keeping only its inputs for backward, which runs it again (no dropout: no RNG state)."""
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)


def _unroll_step(draft: SpecExitDraft, step_ids, hidden, pos, *kv):
    """One TTT step -> (pre-norm hidden, k, v). `kv` holds what earlier steps returned: step 0's
    keys/values with their heads repeated (the causal block every later step attends to), then each
    later step's own [B, nkv, n, d] keys/values (the diagonal entries)."""
    attn = draft.midlayer.self_attn
    scale = 1.0 / math.sqrt(draft.cfg.head_dim)
    q, k, v, res = draft.pre_attn(step_ids, hidden, pos)
    if not kv:
        k, v = attn.repeat_kv(k), attn.repeat_kv(v)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        o = ttt_step_attention(q, kv[0], kv[1], [*kv[2::2], k], [*kv[3::2], v], scale)
    return draft.block_out(o, res), k, v


def ttt_unroll(draft: SpecExitDraft, aux, input_ids, unroll: int, *, hidden=None, recompute: bool = False):
    """Yields (j, pre-norm hidden [B, n, H] of step j, token position t+j+1 per index [n]);
    `draft.head(hidden)` gives step j's draft-vocab logits.

    Index t runs over 0..T-2. Step j's attention: step-0 keys at indices <= t, plus the keys of
    steps 1..j at index t -- exactly the cache the draft sees at inference after j drafted tokens.
    `hidden`: `draft.fuse(aux)[0]` when the caller has it already.
    """
    b, t_len = input_ids.shape
    n = t_len - 1
    if n < 1:
        raise ValueError("sequences must have at least 2 tokens")
    idx = torch.arange(n, device=input_ids.device)
    if hidden is None:
        hidden, _ = draft.fuse(aux)
    hidden = hidden[:, :n]
    kv: tuple[torch.Tensor, ...] = ()
    for j in range(min(unroll, n)):
        tok_pos = idx + j + 1  # token fed at index t: x_{t+j+1}
        step_ids = input_ids[:, tok_pos.clamp(max=t_len - 1)]
        pos = (idx + j)[None].expand(b, n)
        if recompute:
            prenorm, k, v = _recomputed(_unroll_step, draft, step_ids, hidden, pos, *kv)
        else:
            prenorm, k, v = _unroll_step(draft, step_ids, hidden, pos, *kv)
        kv = kv + (k, v)
        yield j, prenorm, tok_pos
        hidden = draft.carry(prenorm)


def _chunk_ce(draft: SpecExitDraft, prenorm, target_logits, tgt_pos, m):
    """Sums over the chunk's positions of m * CE(target softmax, draft log-softmax) and of m * [argmax
    agrees]."""
    logits = draft.head(prenorm).float()
    tgt_p = torch.softmax(target_logits[:, tgt_pos].float(), -1)
    ce = -(tgt_p * torch.log_softmax(logits, -1)).sum(-1)
    with torch.no_grad():
        agree = ((logits.argmax(-1) == tgt_p.argmax(-1)).float() * m).sum()
    return (ce * m).sum(), agree


def ttt_token_loss(draft: SpecExitDraft, aux, input_ids, target_logits, loss_mask, cfg: LossConfig, *, hidden=None):
    """Returns (weighted loss, {acc_j, loss_j}).

    aux [B,T,3H]; input_ids [B,T]; target_logits [B,T,V] or already restricted to the draft vocab
    [B,T,draft_vocab_size] (`target_features(..., vocab_rows=...)`); loss_mask [B,T] (1 where the token at
    that position is one we want drafted, e.g. completion tokens). Step j at index t predicts
    x_{t+j+2}: its target is the target's distribution at position t+j+1, restricted to the draft
    vocab (softmax over those logits, as EAGLE-3 does). The logits are computed `cfg.loss_chunk_tokens`
    positions at a time, again in backward.
    """
    b, t_len = input_ids.shape
    if target_logits.shape[-1] != draft.cfg.draft_vocab_size:  # full target vocab: the draft vocab's columns
        target_logits = target_logits[
            ..., torch.arange(draft.cfg.draft_vocab_size, device=input_ids.device) + draft.d2t
        ]
    chunk = max(1, cfg.loss_chunk_tokens // b)
    total = torch.zeros((), device=input_ids.device)
    weight_sum = 0.0
    metrics: dict[str, float] = {}
    for j, prenorm, tok_pos in ttt_unroll(draft, aux, input_ids, cfg.unroll, hidden=hidden, recompute=cfg.recompute):
        pred_pos = tok_pos + 1
        m = loss_mask[:, pred_pos.clamp(max=t_len - 1)].float() * (pred_pos < t_len)[None].float()
        tgt_pos = tok_pos.clamp(max=t_len - 1)
        ce_sum = agree_sum = 0.0
        for s in range(0, len(tok_pos), chunk):
            e = s + chunk
            ce, agree = _recomputed(_chunk_ce, draft, prenorm[:, s:e], target_logits, tgt_pos[s:e], m[:, s:e])
            ce_sum, agree_sum = ce_sum + ce, agree_sum + agree
        denom = m.sum().clamp(min=1.0)
        step_loss = ce_sum / denom
        wj = cfg.step_decay**j
        total = total + wj * step_loss
        weight_sum += wj
        metrics[f"acc_{j}"] = float(agree_sum / denom)
        metrics[f"loss_{j}"] = float(step_loss.detach())
    return total / weight_sum, metrics


END_FROM = 0.5  # `end_weight` applies from this progress label on: the second half of the thinking


def signal_losses(raw: torch.Tensor, conf, prog, log_rem, mask, end_weight: float = 1.0) -> dict[str, torch.Tensor]:
    """raw [B,T,3] fc signal rows; labels [B,T]; mask [B,T] bool (think tokens). `end_weight`: the
    confidence term's weight on think tokens from END_FROM of the thinking on (a weighted mean)."""
    raw = raw.float()  # bf16 under autocast
    m = mask.float()
    denom = m.sum().clamp(min=1.0)
    bce = F.binary_cross_entropy_with_logits
    wc = m * torch.where(prog >= END_FROM, end_weight, 1.0)  # end_weight 1: exactly m
    return {
        "confidence": (bce(raw[..., 0], conf, reduction="none") * wc).sum() / wc.sum().clamp(min=1.0),
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
