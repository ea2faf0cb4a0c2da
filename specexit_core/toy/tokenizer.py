"""A word-level HF tokenizer for the toy task.

Every number 0..99, every word and the paragraph break are single tokens; ``<think>`` and
``</think>`` are added (non-special, like Qwen3's) tokens so they survive ``skip_special_tokens``.
Tokens carry their leading space (`` 12``) and the decoder fuses them, so decode(encode(x)) == x.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specexit_core.toy.task import MAX_VALUE

PAD, BOS, EOS, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
SPECIAL = [PAD, BOS, EOS, UNK]
THINK_TOKENS = ["<think>", "</think>"]
WORDS = [
    "Compute",
    "from",
    "left",
    "to",
    "right",
    ":",
    "+",
    "-",
    "*",
    "/",
    "=",
    ",",
    ".",
    "?",
    "So",
    "the",
    "answer",
    "is",
    "Let",
    "me",
    "check",
    "again",
    "Check",
    "backwards",
    "Yes",
    "Wait",
    "not",
    "The",
    "user",
    "assistant",
    "system",
]

# Qwen3-style template; the generation prompt opens the think block (as Qwen3-Thinking-2507 does).
# `enable_thinking=False` pre-fills an empty think block (the NoThinking baseline).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}"
    "{% else %}{{ '<think>\n' }}{% endif %}{% endif %}"
)


def vocabulary() -> list[str]:
    words = WORDS + [str(i) for i in range(MAX_VALUE + 1)]
    return SPECIAL + ["\n", "\n\n"] + words + [" " + w for w in words]


def word_level(vocab: list[str], split: str, model_max_length: int) -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer over `vocab` (SPECIAL first), pieces cut by the `split` regex, fused on
    decode; the built-in teachers' one tokenizer shape (the long writer's uses it with its own words)."""
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(split), behavior="isolated")
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


def build_tokenizer() -> PreTrainedTokenizerFast:
    fast = word_level(vocabulary(), r"\n\n|\n| ?[^\s]+| ", model_max_length=512)
    fast.add_tokens(THINK_TOKENS, special_tokens=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast
