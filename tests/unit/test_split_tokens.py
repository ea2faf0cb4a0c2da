"""The one definition of step-split (paragraph-break) tokens, on the toy tokenizer and on a
byte-level BPE tokenizer that merges punctuation with the break (as Qwen / Llama 3 vocabularies do)."""

import json

import pytest
from transformers import AutoTokenizer

from specexit_core.exit import split_token_ids
from specexit_core.exit.split_tokens import OFFICIAL_SPLIT_TEXTS, ends_in_blank_line
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR

# Qwen2/3's pre-tokenizer pattern: a punctuation run takes the line breaks after it (`[\r\n]*`).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def official_split_ids(tok) -> set[int]:
    """The official SpecExit rule: the texts of the fixed list that are one token."""
    ids = (tok.encode(t, add_special_tokens=False) for t in OFFICIAL_SPLIT_TEXTS)
    return {e[0] for e in ids if len(e) == 1}


@pytest.fixture(scope="module")
def merged_bpe():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    text = (
        "First we add the numbers.\n\nWhy is that?\n\nSo:\n\nthe total is 12 \n\nDone\n\n\nok.\n\n\n"
        "then }\n\nline\nnext"
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<think>", "</think>\n\n"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator([text] * 50, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", additional_special_tokens=["<think>", "</think>\n\n"]
    )


def texts(tok, ids) -> set[str]:
    return {tok.convert_tokens_to_string([tok.convert_ids_to_tokens(i)]) for i in ids}


def test_blank_line_rule():
    for t in ("\n\n", ".\n\n", " \n\n\n", "?\n\n", "\t\n\n", "\r\n\r\n", "\n \n", "word\n\n"):
        assert ends_in_blank_line(t), t
    for t in ("\n", ".\n", "\n\n ", "\n\nx", "a \n b\n", ""):
        assert not ends_in_blank_line(t), t


def test_toy_tokenizer_has_one_break_and_the_shipped_draft_agrees():
    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    ids = split_token_ids(tok)
    assert ids == (tok.convert_tokens_to_ids("\n\n"),) and set(ids) == official_split_ids(tok)
    assert list(ids) == json.loads((DRAFT_DIR / "config.json").read_text())["specexit"]["token_ids"]["split"]
    # explicit texts: each must be one token; [] means none
    assert split_token_ids(tok, ["\n\n"]) == ids and split_token_ids(tok, []) == ()
    with pytest.raises(ValueError, match="single token"):
        split_token_ids(tok, ["7 + 5"])


def test_merged_breaks_are_split_tokens_and_the_official_ones_too(merged_bpe):
    tok = merged_bpe
    assert tok.tokenize("Why is that?\n\nSo:\n\n") == ["Why", "Ġis", "Ġthat", "?ĊĊ", "So", ":ĊĊ"]  # merged
    ids = split_token_ids(tok)
    official = official_split_ids(tok)
    assert official < set(ids)  # every official break, and more
    assert texts(tok, official) >= {"\n\n", ".\n\n", " \n\n", "\n\n\n", ".\n\n\n"}
    # what ours adds: paragraph ends the fixed list never sees in this vocabulary
    assert {"?\n\n", ":\n\n", "}\n\n", " }\n\n"} <= texts(tok, set(ids) - official)
    # never a token that only ends a line, never a special token (even one ending in a blank line)
    assert all(ends_in_blank_line(t) for t in texts(tok, ids))
    assert tok.convert_tokens_to_ids("</think>\n\n") not in ids
    assert tok.encode("\n", add_special_tokens=False)[0] not in ids
    # the explicit official list gives exactly the official ids
    assert (
        set(
            split_token_ids(tok, [t for t in OFFICIAL_SPLIT_TEXTS if len(tok.encode(t, add_special_tokens=False)) == 1])
        )
        == official
    )


def test_every_marker_follows_the_one_single_token_rule():
    """`<think>`, `</think>` and split texts: one rule (`single_token_id`) for the stages' token ids
    and for a draft converted for a target, with the marker named in the error."""
    from pipelines.common.tokens import token_ids
    from specexit_core.draft.for_target import exit_token_ids
    from specexit_core.exit.split_tokens import single_token_id

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    assert single_token_id(tok, "</think>", "think_end") == tok.convert_tokens_to_ids("</think>")
    ids = token_ids(tok, think_start="<think>", think_end="</think>")
    assert exit_token_ids(tok) == {"think_start": ids.think_start, "think_end": ids.think_end, "split": list(ids.split)}
    for bad in (lambda: token_ids(tok, think_start="<think> 7", think_end="</think>"),
                lambda: exit_token_ids(tok, think_start="<think> 7")):  # fmt: skip
        with pytest.raises(ValueError, match="think_start '<think> 7' is not a single token"):
            bad()
