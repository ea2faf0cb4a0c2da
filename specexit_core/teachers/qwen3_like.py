"""The `qwen3-like` teacher: what it is and how its text looks (issue #13, item 2).

A tiny `Qwen3ForCausalLM` with Qwen3's real tokenizer and chat template, trained by the project on
`realistic_traces` rendered through that template: the prompt ends with `<|im_start|>assistant\\n`
(`enable_thinking` on, the default), the model writes `<think>\\n...\\n</think>\\n\\n` + answer +
`<|im_end|>`, exactly what vLLM's `qwen3` reasoning parser splits.

Shipped compact (`restricted_vocab.py`): `assets/qwen3_like/` holds the used rows' weights; the
tokenizer is `specexit_core/tokenizers/qwen3/`; `materialize.py` expands both into a full
151,936-row checkpoint that transformers and vLLM load. `SPEC` is what the generic build,
materialize and check read (`spec.py`, `registry.py`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from specexit_core.teachers import spec
from specexit_core.teachers.realistic_traces import RealisticStyle, make_realistic_trace
from specexit_core.tokenizers import QWEN3_TOKENIZER_DIR
from specexit_core.toy.task import Problem

if TYPE_CHECKING:
    from specexit_core.toy.teacher_model import TeacherArch

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


encode_example = spec.encode_example  # the same for every teacher


def qwen3_config(arch: TeacherArch, *, bos_token_id: int, eos_token_id: int, pad_token_id: int):
    """The toy's Qwen3Config builder (`TeacherArch.hf_config`), as the spec calls it."""
    return arch.hf_config(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)


# The first build's float32 teacher hardly ever erred in its first pass (1% of first answers wrong, issue #13
# asks >= 5%): its training text's silent slips were coin flips, which greedy decoding does not follow. The
# trap (a forgotten borrow from a multiple of ten, every time: 14% of problems) is a slip it does follow.
# The trap moves the oracle's exit later on those problems; 2-4 re-checks (greedy: 3-4) keep the
# overthinking inside the band (tests/unit/test_realistic_traces.py).
STYLE = RealisticStyle(trap_slip_prob=1.0, silent_slip_prob=0.08, min_rechecks=2, max_rechecks=4)

SPEC = spec.TeacherSpec(
    name=NAME,
    assets_dir=ASSETS_DIR,
    tokenizer_dir=TOKENIZER_DIR,
    full_vocab_size=FULL_VOCAB_SIZE,
    think_start_id=THINK_START_ID,
    think_end_id=THINK_END_ID,
    bos_token=BOS_TOKEN,
    eos_token=EOS_TOKEN,
    pad_token=PAD_TOKEN,
    reasoning_parser=REASONING_PARSER,
    hf_architecture="Qwen3ForCausalLM",
    think_in_prompt=False,
    chat_prompt=chat_prompt,
    render_example=render_example,
    hf_config=qwen3_config,
    digits_per_token=1,  # Qwen3 writes numbers digit by digit
    build_style=STYLE,
)
