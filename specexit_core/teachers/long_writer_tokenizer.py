"""The long writer's word-level HF tokenizer, in the toy tokenizer's style (`specexit_core/toy/tokenizer.py`).

Every number 0..99 and every word is one token; tokens carry their leading space (`` 12``) and the decoder
fuses them, so decode(encode(x)) == x. Its own file because the task needs its own words: one unique word
before each prompt parameter (`from`, `and`, `by`, `plus`), so that finding a parameter 16K tokens later is a
one-hop content lookup, and `Step` to open each line. A plain `tokenizer.json` that vLLM loads as it is.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from specexit_core.toy.tokenizer import BOS, EOS, PAD, SPECIAL, UNK, word_level

__all__ = ["BOS", "EOS", "PAD", "UNK", "build_tokenizer", "vocabulary"]
WORDS = ["Walk", "from", "and", "by", "plus", "Step", ":", "+", ",", "."]
MAX_NUMBER = 99


def vocabulary() -> list[str]:
    words = WORDS + [str(i) for i in range(MAX_NUMBER + 1)]
    return SPECIAL + ["\n"] + words + [" " + w for w in words]


def build_tokenizer(model_max_length: int = 20480) -> PreTrainedTokenizerFast:
    return word_level(vocabulary(), r"\n| ?[^\s]+| ", model_max_length=model_max_length)
