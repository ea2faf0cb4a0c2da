"""Real tokenizers shipped with the repository (README.md here: sources and licences)."""

from __future__ import annotations

from pathlib import Path

TOKENIZERS_DIR = Path(__file__).resolve().parent
QWEN3_TOKENIZER_DIR = TOKENIZERS_DIR / "qwen3"
R1_DISTILL_LLAMA_TOKENIZER_DIR = TOKENIZERS_DIR / "r1_distill_llama"
