"""EAGLE-3 drafter in plain PyTorch, parameter-for-parameter what vLLM's `Eagle3LlamaForCausalLM` (or,
with `layer: qwen3`, `Eagle3Qwen3ForCausalLM`) runs, with the layer options vLLM honours.

Data flow at draft index t (the convention of vLLM's EAGLE proposer):
    aux_t = concat(target hidden states of 3 layers at t)            [3 * Ht]
    fc(aux_t) = [h_t (H rows) | raw signals (3 rows, SpecExit only)]
    layer input: token x_{t+1} (embedded) and h_t, RoPE position t  -> predicts x_{t+2}
Later draft steps j >= 1 reuse the layer's pre-norm output as h (`carry`) and move the position by one.

Layer math (vLLM's Eagle3 LlamaDecoderLayer with its options off):
    residual = h;  x = [input_layernorm(emb) ; hidden_norm(h)]   (2H into q/k/v)
    residual = attn(x) + residual;  m = mlp(post_attention_layernorm(residual))
    prenorm  = m + residual;  logits = lm_head(norm(prenorm))     (draft vocab; d2t maps to target ids)
The options (DraftConfig, `LAYER_OPTIONS`): norm_before_residual: residual = hidden_norm(h);
norm_before_fc: fc(input_norm(aux)); fc_norm: fc([fc_norm[i](aux_i)]); norm_output: carry norm(prenorm).
The Qwen3 layer normalises each head of q and k (q_norm, k_norm: RMSNorm over head_dim) before RoPE.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from specexit_core.draft.config import DraftConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama (neox-style, rotate-half) rotary embedding. x [B, h, T, d], pos [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = pos.to(torch.float32)[..., None] * inv  # [B, T, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """Under autocast every Linear casts its input anew and keeps that copy for backward; casting
    once before q/k/v (or gate/up) lets them share one low-precision copy. A no-op otherwise."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return x.to(torch.get_autocast_dtype(dev))
    return x


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.nh, self.nkv, self.hd, self.theta = nh, nkv, hd, cfg.rope_theta
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        if cfg.layer == "qwen3":  # Qwen3Attention: RMSNorm over each head's dims, before RoPE
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        """x [B, T, 2H] -> q [B, nh, T, d], k/v [B, nkv, T, d] (`repeat_kv` spreads them over the q heads)."""
        b, t, _ = x.shape
        x = autocast_input(x)
        q = self.q_proj(x).view(b, t, self.nh, self.hd)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        return rope(q, pos, self.theta), rope(k, pos, self.theta), v

    def repeat_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """[B, nkv, T, d] -> [B, nh, T, d] (GQA: each kv head serves nh / nkv query heads)."""
        return kv.repeat_interleave(self.nh // self.nkv, 1)

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        x = autocast_input(x)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)


class SpecExitDraft(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)  # copied from the target, frozen
        self.embed_tokens.weight.requires_grad_(False)
        ht = cfg.target_hidden_size
        # the options that normalise fc's input (None when off: no parameter, as in vLLM)
        self.input_norm = RMSNorm(3 * ht, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = nn.ModuleList(RMSNorm(ht, cfg.rms_norm_eps) for _ in range(3)) if cfg.fc_norm else None
        self.fc = nn.Linear(3 * ht, cfg.fc_out, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))

    # -- pieces --------------------------------------------------------------------------------
    def fc_input(self, aux: torch.Tensor) -> torch.Tensor:
        """[.., 3*Ht] target features -> what fc multiplies (normalised under norm_before_fc / fc_norm,
        in vLLM's order: input_norm, then fc_norm per target layer)."""
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, aux.chunk(3, dim=-1))], -1)
        return aux

    def fuse(self, aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[.., 3*Ht] target features -> (h [.., H], raw signals [.., n_signals])."""
        y = self.fc(self.fc_input(aux))
        return y[..., : self.cfg.hidden_size], y[..., self.cfg.hidden_size :]

    def pre_attn(self, input_ids, hidden, pos):
        """Returns q [B, nh, T, d], k/v [B, nkv, T, d] and the residual of the single decoder layer."""
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        x = torch.cat([layer.input_layernorm(self.embed_tokens(input_ids)), normed], -1)
        q, k, v = layer.self_attn.qkv(x, pos)
        return q, k, v, normed if self.cfg.norm_before_residual else hidden

    def block_out(self, attn_out, residual):
        """Attention output [B, nh, T, d] -> the layer's pre-norm output (the next step's hidden)."""
        layer = self.midlayer
        residual = layer.self_attn.out(attn_out) + residual
        return layer.mlp(layer.post_attention_layernorm(residual)) + residual

    def head(self, prenorm):
        """Pre-norm hidden -> draft-vocab logits."""
        return self.lm_head(self.norm(prenorm))

    def carry(self, prenorm):
        """The layer's pre-norm output -> the hidden the next draft step takes (vLLM's `aux_output`)."""
        return self.norm(prenorm) if self.cfg.norm_output else prenorm

    def post_attn(self, attn_out, residual):
        """Attention output [B, nh, T, d] -> (draft-vocab logits, the hidden for the next step)."""
        prenorm = self.block_out(attn_out, residual)
        return self.head(prenorm), self.carry(prenorm)

    # -- vocab mapping -------------------------------------------------------------------------
    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Scatter draft-vocab logits into the target vocab (-inf elsewhere), as vLLM does."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.cfg.vocab_size), float("-inf"))
        idx = torch.arange(self.cfg.draft_vocab_size, device=draft_logits.device)
        out[..., idx + self.d2t] = draft_logits
        return out

    # -- inference: one forward over new positions with a KV cache ------------------------------
    def forward_cached(self, input_ids, hidden, pos, cache: DraftKV | None):
        """Run new positions (attending to the cache and causally to each other); append their k/v.
        Returns (draft-vocab logits, the hidden the next step takes, the cache)."""
        q, k, v, res = self.pre_attn(input_ids, hidden, pos)
        if cache is None:
            cache = DraftKV()
        k_all = k if cache.k is None else torch.cat([cache.k, k], 2)
        v_all = v if cache.v is None else torch.cat([cache.v, v], 2)
        past = k_all.shape[2] - k.shape[2]
        t = q.shape[2]
        mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(past)
        attn = self.midlayer.self_attn
        o = F.scaled_dot_product_attention(q, attn.repeat_kv(k_all), attn.repeat_kv(v_all), attn_mask=mask)
        cache.k, cache.v = k_all, v_all
        logits, carried = self.post_attn(o, res)
        return logits, carried, cache


class DraftKV:
    """Draft KV cache of one sequence batch: [B, nkv, S, d]; `crop(n)` drops speculative entries."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def crop(self, n: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


def expected_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a checkpoint for `cfg` (built on the meta device: no memory, so a real
    8B head's 128k x 4096 embedding is not allocated just to learn its shape)."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in SpecExitDraft(cfg).state_dict().items()}
