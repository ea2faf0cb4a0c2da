import random

from transformers import AutoTokenizer

from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems
from specexit_core.toy.tokenizer import build_tokenizer, vocabulary
from specexit_core.toy.traces import make_trace


def test_special_pieces_are_single_tokens():
    tok = build_tokenizer()
    for piece in ["<think>", "</think>", "\n\n", "<|im_end|>", "42", " 42", " 99", "0"]:
        ids = tok(piece, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, (piece, ids)
        assert tok.convert_ids_to_tokens(ids[0]) != tok.unk_token
    # <think> / </think> survive skip_special_tokens (like Qwen3), the chat markers do not
    ids = tok("<think>\n1 + 2 = 3\n\n</think>\n\nThe answer is 3 .<|im_end|>", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\n1 + 2 = 3\n\n</think>\n\nThe answer is 3 ."


def test_round_trip_on_traces():
    tok = build_tokenizer()
    rng = random.Random(0)
    for p in problems("dev", 200):
        text = (
            tok.apply_chat_template([{"role": "user", "content": p.prompt}], tokenize=False, add_generation_prompt=True)
            + make_trace(p, rng).completion
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text


def test_chat_template_opens_think_block():
    tok = build_tokenizer()
    msgs = [{"role": "user", "content": "Compute from left to right : 1 + 2"}]
    t = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert t.endswith("<|im_start|>assistant\n<think>\n")
    t2 = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert t2.endswith("<think>\n\n</think>\n\n")


def test_shipped_tokenizer_matches_builder():
    shipped = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    built = build_tokenizer()
    assert shipped.get_vocab() == built.get_vocab()
    assert len(built) == len(vocabulary()) + 2
    s = "<|im_start|>user\nCompute from left to right : 3 * 4<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert shipped(s)["input_ids"] == built(s)["input_ids"]
