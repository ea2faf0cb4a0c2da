"""Attention of one training-time-test (TTT) unroll step, without a dense T x T score or mask tensor.

Unroll step j >= 1 at index t attends to the step-0 keys of indices <= t (a causal block) plus the
keys of steps 1..j at index t only (one "diagonal" key per earlier step, its own included):

    o_t = softmax([s_t,0..t | d_t,1..d_t,j]) . [v0_0..t | v1_t..vj_t]

As in the official EAGLE-3 trainers, the causal block runs in the fused kernel (flash / memory-
efficient on CUDA, the flash kernel on CPU), which also returns the block's log-sum-exp L_c; the
diagonal scores are j dot products per query; both parts merge by their log-sum-exps:

    L = logsumexp(L_c, d_1..d_j),  o = exp(L_c - L) o_c + sum_i exp(d_i - L) v_i

The kernels' L_c carries no gradient, so `_lse_grad_carrier` adds one that is exactly zero in value
and has L_c's gradient: dL_c/dq_t = scale sum_s p_ts k_s, dL_c/dk_s = scale sum_t p_ts q_t, i.e.
attention with the keys as values, its weights detached (SDPA's dV routes p^T to the keys).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _fused_causal(q, k, v, scale):
    """(output with gradient, log-sum-exp [B, h, T] fp32 without) from the fused kernels."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    if q.device.type == "cuda":
        if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256 and q.shape[-1] % 8 == 0:
            out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
            return out[0], out[1]
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True, scale=scale)
        return out[0], out[1][..., : q.shape[2]]  # its lse is padded to a multiple of 32 queries
    return _math_causal(q, k, v, scale)


@torch.no_grad()
def _chunked_lse(q, k, scale, chunk: int = 1024):
    """Causal log-sum-exp over query chunks (other devices): at most chunk x T scores at a time."""
    t = q.shape[2]
    out = []
    for s in range(0, t, chunk):
        e = min(t, s + chunk)
        sc = (q[:, :, s:e].float() @ k[:, :, :e].float().transpose(-1, -2)) * scale
        keep = torch.arange(e, device=q.device)[None, :] <= torch.arange(s, e, device=q.device)[:, None]
        out.append(torch.logsumexp(sc.masked_fill(~keep, float("-inf")), -1))
    return torch.cat(out, -1)


def _math_causal(q, k, v, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale), _chunked_lse(q, k, scale)


def _lse_grad_carrier(q, k, scale):
    """Zero-valued [B, h, T] tensor whose gradient w.r.t. q and k is that of the causal log-sum-exp."""
    m = F.scaled_dot_product_attention(q.detach(), k.detach(), k, is_causal=True, scale=scale)
    qm = (q * m).sum(-1, dtype=torch.float32) * scale
    return qm - qm.detach()


def causal_attention_lse(q, k, v, scale: float):
    """Causal attention [B, h, T, d] (same head count for q, k, v) and its log-sum-exp [B, h, T] fp32,
    both differentiable."""
    o, lse = _fused_causal(q, k, v, scale)
    lse = lse.float()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        lse = lse + _lse_grad_carrier(q, k, scale)
    return o, lse


def ttt_step_attention(q, k0, v0, diag_k, diag_v, scale: float):
    """Step j >= 1: q [B, nh, T, d]; k0/v0 [B, nh, T, d] the step-0 keys/values (heads repeated);
    diag_k/diag_v the j per-index keys/values of steps 1..j, [B, nkv, T, d] (nkv divides nh; they
    are broadcast over the query heads, never repeated). Returns [B, nh, T, d] in q's dtype."""
    b, nh, t, d = q.shape
    nkv = diag_k[0].shape[1]
    o_c, lse_c = causal_attention_lse(q, k0, v0, scale)
    qg = q.view(b, nkv, nh // nkv, t, d)
    diag = [(qg * kd[:, :, None]).sum(-1, dtype=torch.float32).reshape(b, nh, t) * scale for kd in diag_k]
    lse = torch.logsumexp(torch.stack([lse_c, *diag]), 0)
    o = torch.exp(lse_c - lse)[..., None] * o_c
    for s, vd in zip(diag, diag_v):
        w = torch.exp(s - lse).reshape(b, nkv, nh // nkv, t, 1)
        o = o + (w * vd[:, :, None]).reshape(b, nh, t, d)
    return o.to(q.dtype)
