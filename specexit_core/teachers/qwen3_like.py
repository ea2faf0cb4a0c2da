"""The `qwen3-like` teacher: what it is and how its text looks (issue #13, item 2).

A tiny `Qwen3ForCausalLM` with Qwen3's real tokenizer and chat template, trained by the project on
`realistic_traces` rendered through that template: the prompt ends with `<|im_start|>assistant\\n`
(`enable_thinking` on, the default), the model writes `<think>\\n...\\n</think>\\n\\n` + answer +
`<|im_end|>`, exactly what vLLM's `qwen3` reasoning parser splits.

Shipped compact (`restricted_vocab.py`): `assets/qwen3_like/` holds the used rows' weights; the
tokenizer is `specexit_core/tokenizers/qwen3/`; `materialize.py` expands both into a full
151,936-row checkpoint that transformers and vLLM load.
"""

from __future__ import annotations

import random
from pathlib import Path

from specexit_core.teachers.realistic_traces import RealisticStyle, make_realistic_trace
from specexit_core.tokenizers import QWEN3_TOKENIZER_DIR
from specexit_core.toy.task import Problem

NAME = "qwen3-like"
ASSETS_DIR = Path(__file__).resolve().parent / "assets" / "qwen3_like"
TOKENIZER_DIR = QWEN3_TOKENIZER_DIR
FULL_VOCAB_SIZE = 151936  # Qwen3's embedding rows (151,669 tokens, padded to a multiple of 128)
THINK_START_ID, THINK_END_ID = 151667, 151668
EOS_TOKEN, PAD_TOKEN, BOS_TOKEN = "<|im_end|>", "<|endoftext|>", "<|endoftext|>"
REASONING_PARSER = "qwen3"  # vLLM's parser for this template


def load_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def chat_prompt(tok, p: Problem) -> str:
    """The generation prompt (thinking on: the model opens `<think>` itself, as Qwen3 does)."""
    return tok.apply_chat_template(
        [{"role": "user", "content": p.prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=True
    )


def render_example(tok, p: Problem, rng: random.Random, style: RealisticStyle) -> tuple[str, str]:
    """(prompt, completion) of one sampled trace, both rendered by the chat template; the completion
    ends with the EOS `<|im_end|>` (the template's trailing newline is not something to learn)."""
    t = make_realistic_trace(p, rng, style)
    msgs = [
        {"role": "user", "content": p.prompt},
        {"role": "assistant", "content": t.answer_text, "reasoning_content": t.think_text.rstrip("\n")},
    ]
    full = tok.apply_chat_template(msgs, tokenize=False)
    prompt = chat_prompt(tok, p)
    if not full.startswith(prompt):
        raise ValueError("the chat template renders the prompt differently inside a conversation")
    completion = full[len(prompt) :]
    return prompt, completion[: completion.rindex(EOS_TOKEN) + len(EOS_TOKEN)]


def encode_example(tok, prompt: str, completion: str) -> tuple[list[int], int]:
    """Token ids of prompt + completion, and the prompt's length (the loss starts after it)."""
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    c = tok(completion, add_special_tokens=False)["input_ids"]
    return p + c, len(p)
