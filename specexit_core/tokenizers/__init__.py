"""Real tokenizers shipped with the repository (README.md here: sources and licences)."""

from __future__ import annotations

from pathlib import Path

TOKENIZERS_DIR = Path(__file__).resolve().parent
QWEN3_TOKENIZER_DIR = TOKENIZERS_DIR / "qwen3"
