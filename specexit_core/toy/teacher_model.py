"""The toy teacher's architecture: a standard Qwen3ForCausalLM, small enough to ship in the repo.

The other built-in teachers (teachers/) take the same shape with their own sizes (`TeacherArch` subclasses
or instances), so the HF config is built in one place."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import Qwen3Config


@dataclass(frozen=True)
class TeacherArch:
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    max_position_embeddings: int = 512
    vocab_size: int = 272  # tokenizer has 270 tokens; rounded up to a multiple of 16
    rope_theta: float = 10000.0

    def hf_config(self, *, bos_token_id: int, eos_token_id: int, pad_token_id: int) -> Qwen3Config:
        return Qwen3Config(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            architectures=["Qwen3ForCausalLM"],
        )
