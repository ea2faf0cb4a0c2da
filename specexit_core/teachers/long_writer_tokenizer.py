"""The long writer's word-level HF tokenizer, in the toy tokenizer's style (`specexit_core/toy/tokenizer.py`).

Every number 0..99 and every word is one token; tokens carry their leading space (`` 12``) and the decoder
fuses them, so decode(encode(x)) == x. Its own file because the task needs its own words: one unique word
before each prompt parameter (`from`, `and`, `by`, `plus`), so that finding a parameter 16K tokens later is a
one-hop content lookup, and `Step` to open each line. A plain `tokenizer.json` that vLLM loads as it is.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
SPECIAL = [PAD, BOS, EOS, UNK]
WORDS = ["Walk", "from", "and", "by", "plus", "Step", ":", "+", ",", "."]
MAX_NUMBER = 99


def vocabulary() -> list[str]:
    words = WORDS + [str(i) for i in range(MAX_NUMBER + 1)]
    return SPECIAL + ["\n"] + words + [" " + w for w in words]


def build_tokenizer(model_max_length: int = 20480) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n| ?[^\s]+| "), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[BOS],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
