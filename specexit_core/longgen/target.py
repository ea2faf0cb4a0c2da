"""The target model's forward, written out over a transformers Llama / Qwen2 / Qwen3 model's own modules.

TokenSwift needs three things a stock `model(...)` call does not give together: an arbitrary (tree) attention
mask over new tokens, attention over a *partial* KV cache whose kept positions differ per layer and KV head,
and the hidden state before the final norm (the draft heads' input). So this module runs the decoder layers
itself, reusing the model's norms, projections, MLPs, rotary embedding and LM head (no weights copied);
`tests/unit/test_longgen_target.py` checks it against the model's own forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Full KV of one sequence: per layer K, V [kv_heads, capacity, head_dim], the first `length` used."""

    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, dtype, device, capacity: int = 256):
        self.k = [torch.empty(kv_heads, capacity, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.empty_like(t) for t in self.k]
        self.length = 0
        self._pending = 0  # tokens appended by the running forward, not yet committed

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.length + self._pending
        return self.k[i][:, :n], self.v[i][:, :n]

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [kv_heads, T, d] at positions length.. (the same T for every layer of one forward)."""
        t = k.shape[1]
        need = self.length + t
        if need > self.k[i].shape[1]:
            cap = max(need, 2 * self.k[i].shape[1])
            for buf in (self.k, self.v):
                new = buf[i].new_empty(buf[i].shape[0], cap, buf[i].shape[2])
                new[:, : self.length] = buf[i][:, : self.length]
                buf[i] = new
        self.k[i][:, self.length : need] = k
        self.v[i][:, self.length : need] = v
        self._pending = t

    def commit(self, keep: list[int] | None = None) -> None:
        """Make the last forward's tokens part of the cache: all of them, or only the offsets `keep`
        (ascending; e.g. the root and the accepted path of a tree), moved down to be contiguous."""
        t, self._pending = self._pending, 0
        if keep is None:
            self.length += t
            return
        if keep != list(range(len(keep))):
            src = torch.tensor(keep, device=self.k[0].device) + self.length
            for buf in (self.k, self.v):
                for i in range(len(buf)):
                    buf[i][:, self.length : self.length + len(keep)] = buf[i][:, src]
        self.length += len(keep)


class Target:
    """A decoder-only HF model seen as: embed -> layers -> pre-norm hidden -> norm -> LM head."""

    def __init__(self, model):
        self.model = model.eval()
        inner = model.model
        cfg = model.config
        # sliding-window attention: every layer or none (as vLLM's Qwen2/Qwen3 take it); None: full attention
        self.window = window_of(cfg)
        self.embed, self.layers, self.norm, self.rotary = inner.embed_tokens, inner.layers, inner.norm, inner.rotary_emb
        self.lm_head = model.lm_head
        self.n_heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.rms_norm_eps = cfg.rms_norm_eps
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device, capacity)

    def logits(self, pre_norm: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(pre_norm)).float()

    @torch.inference_mode()
    def forward(self, ids: list[int], positions: list[int], cache: KVCache, tree_mask=None, partial=None):
        """Run `ids` (at `positions`) after the cached context; returns the pre-norm hidden states [T, H].

        tree_mask [T, T] bool: which new tokens each new token sees (None: causal). The context is always
        fully visible. With `partial` (a PartialKV) the context is the drafter's partial cache instead of
        `cache`, and nothing is appended to `cache` (a draft forward); otherwise the new K, V are appended
        to `cache` (call `cache.commit` after). A sliding-window model (`self.window`) attends to the last
        `window` positions only, in both kinds of forward: its drafts read the window, not the partial cache."""
        dev = self.device
        t = len(ids)
        x = self.embed(torch.tensor(ids, device=dev))[None]  # [1, T, H]
        pos = torch.tensor(positions, device=dev)[None]
        cos, sin = self.rotary(x, pos)  # [1, T, d]
        if tree_mask is None:
            tree_mask = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        # a windowed model reads cache positions > first position - window only (cache slot j holds position j)
        qpos = pos[0]
        lo = 0 if self.window is None else max(0, min(positions) - self.window + 1)
        for i, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            q, k, v = self._qkv(layer.self_attn, h, cos, sin)  # [heads, T, d], [kv, T, d] x2
            if partial is None:
                cache.append(i, k, v)
                ck, cv = cache.layer(i)  # context + new
                ck, cv = ck[:, lo:], cv[:, lo:]
            elif self.window is not None:  # the window bounds what a draft reads: it is the partial cache
                pk, pv = cache.layer(i)
                ck, cv = torch.cat([pk[:, lo:], k], 1), torch.cat([pv[:, lo:], v], 1)
                partial.note_window(ck.shape[1] - t)
            else:
                pk, pv = partial.layer(i, q, cache)
                ck, cv = torch.cat([pk, k], 1), torch.cat([pv, v], 1)
            ctx = ck.shape[1] - t
            mask = torch.cat([torch.ones(t, ctx, dtype=torch.bool, device=dev), tree_mask.to(dev)], 1)
            if self.window is not None:  # a key at position j is seen from position p while p - j < window
                kpos = torch.cat([torch.arange(lo, lo + ctx, device=dev), qpos])
                mask = mask & (qpos[:, None] - kpos[None, :] < self.window)
            rep = self.n_heads // self.kv_heads
            o = F.scaled_dot_product_attention(
                q[None],
                ck.repeat_interleave(rep, 0)[None],
                cv.repeat_interleave(rep, 0)[None],
                attn_mask=mask[None, None],
                scale=layer.self_attn.scaling,
            )[0]  # [heads, T, d]
            o = layer.self_attn.o_proj(o.transpose(0, 1).reshape(1, t, -1))
            x = x + o
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x[0]

    def _qkv(self, attn, h, cos, sin):
        t = h.shape[1]
        q = attn.q_proj(h).view(1, t, -1, self.head_dim)
        k = attn.k_proj(h).view(1, t, -1, self.head_dim)
        v = attn.v_proj(h).view(1, t, -1, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:  # Qwen3: RMSNorm on the head dim before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)  # [heads, T, d]
        c, s = cos[0][None], sin[0][None]
        return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s, v


def window_of(cfg) -> int | None:
    """The sliding window of an HF decoder config when every layer has it; None for full attention. A
    config that mixes windowed and full layers is refused (this engine, like vLLM's Qwen3, takes all or none)."""
    if not (getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None)):
        return None
    kinds = set(getattr(cfg, "layer_types", None) or ["sliding_attention"])
    if kinds != {"sliding_attention"}:
        raise ValueError(f"mixed sliding-window and full-attention layers are not supported: {sorted(kinds)}")
    return int(cfg.sliding_window)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)
