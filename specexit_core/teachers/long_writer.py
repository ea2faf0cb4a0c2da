"""The long writer: a built-in teacher that writes 16K+ checkable tokens (issue #14, item 2).

A tiny standard `Qwen3ForCausalLM` (loads in transformers, in `longgen.target.Target` and in vLLM 0.32 CPU)
with its own word-level tokenizer, trained by `long_writer_build` on the walk of `long_writer_task`. It exists
to benchmark long generation (TokenSwift-style engines, `specexit bench longgen`) at 1K, 4K and 16K tokens on
a model whose every output step can be scored. Shipped under `assets/long_writer/` (weights in bf16; load in
float32 for parity between transformers and vLLM), TokenSwift draft heads for it under
`assets/long_writer_heads/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specexit_core.toy.teacher_model import TeacherArch

ASSETS = Path(__file__).resolve().parent / "assets"
LONG_WRITER_DIR = ASSETS / "long_writer"
LONG_WRITER_HEADS_DIR = ASSETS / "long_writer_heads"
LONG_WRITER_DRAFT_DIR = ASSETS / "long_writer_draft"  # EAGLE-3 draft (long_writer_draft.py)
MAX_OUTPUT_TOKENS = 20000  # what the build trains positions for (16K + margin), prompt excluded
MAX_MODEL_LEN = 20480  # max_position_embeddings = prompt + MAX_OUTPUT_TOKENS, rounded up


@dataclass(frozen=True)
class LongWriterArch(TeacherArch):
    """The toy's shape (`TeacherArch.hf_config`), sized and positioned for 16K+ tokens."""

    hidden_size: int = 256
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # GQA
    head_dim: int = 64
    intermediate_size: int = 768
    max_position_embeddings: int = MAX_MODEL_LEN
    # Long-context models raise RoPE's base so the slowest frequencies barely turn over the whole context
    # (Qwen2.5 uses 1e6 for 32K): content lookups 16K back then see nearly the rotation they saw nearby.
    rope_theta: float = 1e6
    vocab_size: int = 240  # the tokenizer has 225 tokens; rounded up to a multiple of 16
    # Every layer attends to the last `sliding_window` tokens only (Mistral-7B-v0.1's design; a stock
    # Qwen3 config: `use_sliding_window`, `max_window_layers` 0, loads as such in transformers and vLLM).
    # The walk needs the previous line alone, and with a window a position 16K in sees what a training
    # window showed: full attention over 16K lost the previous line among ~1,200 like it
    # (docs/longgen.md, "A teacher that writes long"). None: full attention (the first builds).
    sliding_window: int | None = None

    def hf_config(self, **ids):
        cfg = super().hf_config(**ids)
        if self.sliding_window is not None:
            cfg.use_sliding_window, cfg.sliding_window, cfg.max_window_layers = True, self.sliding_window, 0
            cfg.layer_types = ["sliding_attention"] * self.num_hidden_layers
        return cfg


def load_long_writer(model_dir: str | Path = LONG_WRITER_DIR, threads: int | None = None):
    """(model in float32, eval mode; tokenizer) from a built folder."""
    from specexit_core.toy.hf_generate import load_teacher

    return load_teacher(model_dir, threads=threads)
