"""Step-split ("paragraph break") tokens: where the exit may be checked, for any tokenizer.

The official SpecExit code (Tencent AngelSlim) checks at the tokens of a fixed list of texts,
those of them that are one token in the target's tokenizer: `OFFICIAL_SPLIT_TEXTS` =
"\\n\\n", "\\n\\n\\n", ".\\n\\n", ".\\n\\n\\n", " \\n\\n", " \\n\\n\\n".

Ours is wider, on purpose: every single vocabulary token whose text ends in a blank line (a
newline, optional spaces / tabs / CR, a newline), special tokens excepted. Every official text
that is one token is such a token, so the official set is always included. Added, and why:
byte-level BPE vocabularies (Qwen2/3, Llama 3 and so the DeepSeek-R1 distills) merge a run of
punctuation with the line breaks after it (their pre-tokenizer has ` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*`),
so a paragraph that ends in "?", ":", ")" or "**" ends in one token such as "?\\n\\n" and is
never followed by a bare "\\n\\n": the fixed list never checks at those paragraph ends, the
paper's rule (check at every paragraph break) does. Likewise longer or other blank-line runs
("\\n\\n\\n\\n", "\\t\\n\\n", "\\r\\n\\r\\n"). On the toy tokenizer both rules give the same single
token, "\\n\\n". A config can still name the texts explicitly (`split_tokens: [...]`), e.g. the
official list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

OFFICIAL_SPLIT_TEXTS = ("\n\n", "\n\n\n", ".\n\n", ".\n\n\n", " \n\n", " \n\n\n")

# Ends in a blank line: a newline, nothing but horizontal whitespace, a newline.
_ENDS_IN_BLANK_LINE = re.compile(r"\n[^\S\n]*\n\Z")


def ends_in_blank_line(text: str) -> bool:
    return _ENDS_IN_BLANK_LINE.search(text) is not None


def split_token_ids(tokenizer, texts: Iterable[str] | None = None) -> tuple[int, ...]:
    """The step-split token ids of a (Hugging Face) tokenizer, sorted.

    texts=None: every single vocabulary token that ends in a blank line (see the module doc).
    texts given: exactly those texts, each of which must be one token (`[]` gives `()`)."""
    if texts is not None:
        return tuple(sorted({single_token_id(tokenizer, t) for t in texts}))
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    found = {
        i
        for token, i in tokenizer.get_vocab().items()
        if i not in special and ends_in_blank_line(tokenizer.convert_tokens_to_string([token]))
    }
    if not found:
        raise ValueError("no single-token paragraph break in this tokenizer; set split_tokens in the config")
    return tuple(sorted(found))


def single_token_id(tokenizer, text: str, what: str = "split token") -> int:
    """The id of `text` when it is exactly one (known) token of the tokenizer: the rule for every
    marker the exit reads (split tokens, `<think>` / `</think>`); otherwise a ValueError naming it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1 or ids[0] == tokenizer.unk_token_id:
        raise ValueError(f"{what} {text!r} is not a single token of this tokenizer (ids {ids})")
    return int(ids[0])
