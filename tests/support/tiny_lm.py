"""Tiny random decoder-only transformers models (fixed seed) for the long-generation engine's unit tests."""

from __future__ import annotations

import torch


def tiny_lm(arch: str = "qwen3", vocab: int = 64, seed: int = 0, layers: int = 2, sliding_window: int | None = None):
    """A randomly initialised Qwen3 / Llama / Qwen2 causal LM, float32, eval mode (GQA: 4 query, 2 KV heads);
    `sliding_window` (Qwen3 / Qwen2): every layer attends to that many last positions."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    cls = {
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }
    cfg_cls, model_cls = cls[arch]
    cfg = cfg_cls(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        eos_token_id=vocab - 1,
        bos_token_id=0,
        pad_token_id=0,
        **(
            {}
            if sliding_window is None
            else {"use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": 0}
        ),
    )
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    with torch.no_grad():  # sharper logits than the default init: fewer near-ties, more repetition
        model.lm_head.weight.mul_(8.0) if not cfg.tie_word_embeddings else model.model.embed_tokens.weight.mul_(8.0)
    return model
