"""The `r1-llama-like` teacher: what it is and how its text looks (issue #13, item 2).

A tiny `LlamaForCausalLM` with DeepSeek-R1-Distill-Llama's tokenizer and chat template
(`specexit_core/tokenizers/r1_distill_llama/`, derived from Llama 3.1's), trained by the project on
`realistic_traces`. Unlike Qwen3, R1's generation prompt already opens the thinking block
(`...<｜Assistant｜><think>\\n`), so the model writes thinking text + `\\n</think>\\n\\n` + answer +
`<｜end▁of▁sentence｜>`, which vLLM's `deepseek_r1` reasoning parser splits (it expects no `<think>`
in the output). Shipped compact like qwen3-like (`restricted_vocab.py`, `assets/r1_llama_like/`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from specexit_core.teachers import spec
from specexit_core.teachers.realistic_traces import RealisticStyle, make_realistic_trace
from specexit_core.tokenizers import R1_DISTILL_LLAMA_TOKENIZER_DIR
from specexit_core.tokenizers.derive_r1_distill_llama import BOS, EOS, PAD
from specexit_core.toy.task import Problem

if TYPE_CHECKING:
    from specexit_core.toy.teacher_model import TeacherArch

NAME = "r1-llama-like"
ASSETS_DIR = Path(__file__).resolve().parent / "assets" / "r1_llama_like"
TOKENIZER_DIR = R1_DISTILL_LLAMA_TOKENIZER_DIR
FULL_VOCAB_SIZE = 128256  # Llama 3.1's embedding rows (128,000 BPE tokens + 256 added)
THINK_START_ID, THINK_END_ID = 128013, 128014
EOS_TOKEN, PAD_TOKEN, BOS_TOKEN = EOS, PAD, BOS
REASONING_PARSER = "deepseek_r1"
THINK_END = "</think>"


def chat_prompt(tok, p: Problem) -> str:
    """The generation prompt: `<｜begin▁of▁sentence｜><｜User｜>...<｜Assistant｜><think>\\n`."""
    return tok.apply_chat_template([{"role": "user", "content": p.prompt}], tokenize=False, add_generation_prompt=True)


def render_example(tok, p: Problem, rng: random.Random, style: RealisticStyle) -> tuple[str, str]:
    """(prompt, completion) of one sampled trace. R1's template cannot render the thinking of an
    assistant turn (it keeps only the text after `</think>`), so the completion is written here in
    R1's output shape; the template still checks that the answer part is what it would render."""
    t = make_realistic_trace(p, rng, style)
    body = f"{t.think_text.strip(chr(10))}\n{THINK_END}\n\n{t.answer_text}"
    prompt = chat_prompt(tok, p)
    history = tok.apply_chat_template(
        [{"role": "user", "content": p.prompt}, {"role": "assistant", "content": body}], tokenize=False
    )
    if not history.endswith(body[body.index(THINK_END) + len(THINK_END) :] + EOS_TOKEN):
        raise ValueError("the chat template renders the answer differently from the completion")
    return prompt, body + EOS_TOKEN


def llama_config(arch: TeacherArch, *, bos_token_id: int, eos_token_id: int, pad_token_id: int):
    """`TeacherArch` as a LlamaConfig: the same shape as the Qwen3 teachers (Llama has no q/k norm)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        rope_theta=arch.rope_theta,
        rms_norm_eps=1e-5,  # Llama 3's
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=True,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        architectures=["LlamaForCausalLM"],
    )


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
    hf_architecture="LlamaForCausalLM",
    think_in_prompt=True,
    chat_prompt=chat_prompt,
    render_example=render_example,
    hf_config=llama_config,
    digits_per_token=3,  # Llama 3 writes numbers in groups of up to three digits
    # 1200 steps at lr 3e-3 (qwen3-like's) scored 0.21, at 1.5e-3 0.56 (docs/results/r1_llama_like_lr_ab.json)
    build_lr=1.5e-3,
)
