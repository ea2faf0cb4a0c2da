"""The Qwen3 tokenizer shipped in specexit_core/tokenizers loads offline and behaves like Qwen3's:
`<think>` ids, the chat template's `enable_thinking`, paragraph breaks merged with punctuation."""

import pytest

from specexit_core.exit.split_tokens import OFFICIAL_SPLIT_TEXTS, split_token_ids
from specexit_core.tokenizers import QWEN3_TOKENIZER_DIR


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer):
    return qwen3_tokenizer


def test_shipped_folder_is_where_the_fixture_loads_from(qwen3):
    assert (QWEN3_TOKENIZER_DIR / "tokenizer.json").exists() and qwen3.name_or_path == str(QWEN3_TOKENIZER_DIR)


def test_qwen3_vocabulary_and_think_tokens(qwen3):
    assert len(qwen3) == 151669
    assert qwen3.convert_tokens_to_ids(["<think>", "</think>"]) == [151667, 151668]
    assert qwen3.eos_token == "<|im_end|>"


def test_qwen3_template_thinking_switch(qwen3):
    msgs = [{"role": "user", "content": "What is 3+4?"}]
    thinking = qwen3.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    plain = qwen3.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert thinking.endswith("<|im_start|>assistant\n")
    assert plain == thinking + "<think>\n\n</think>\n\n"


def test_qwen3_paragraph_breaks_merge_with_punctuation(qwen3):
    pieces = [qwen3.decode([i]) for i in qwen3.encode("So 3+4=7.\n\nWait, check:\n\nOK \n\nx")]
    assert {".\n\n", ":\n\n", " \n\n"} <= set(pieces) and "\n\n" not in pieces
    ours = set(split_token_ids(qwen3))
    official = set(split_token_ids(qwen3, [t for t in OFFICIAL_SPLIT_TEXTS if len(qwen3.encode(t)) == 1]))
    assert official < ours  # ours checks at ":\n\n" too, the official list does not
    assert qwen3.convert_tokens_to_ids(qwen3.tokenize(":\n\n"))[0] in ours - official
