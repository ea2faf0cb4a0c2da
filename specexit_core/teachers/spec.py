"""What a built-in teacher with a real vocabulary is, in one typed record (issue #13, item 2).

The build, `materialize` and the check are generic; everything that differs between teachers lives in
a `TeacherSpec`: the tokenizer and its special tokens, the model class, the vLLM reasoning parser, and
how a realistic trace becomes (prompt, completion) text under that model's chat template. The two
template shapes met so far: Qwen3 lets the model open `<think>` itself (the completion starts with
`<think>`); DeepSeek-R1 puts `<think>\\n` at the end of the generation prompt (the completion starts
with the thinking text). `think_in_prompt` tells the two apart. The registry: `registry.py`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specexit_core.teachers.realistic_traces import RealisticStyle
from specexit_core.toy.task import Problem

if TYPE_CHECKING:  # (transformers is imported only when a model is made: the CLI lists teachers fast)
    from specexit_core.toy.teacher_model import TeacherArch

# (tok, problem, rng, style) -> (prompt, completion); the completion ends with the EOS token's text
RenderFn = Callable[[Any, Problem, random.Random, RealisticStyle], tuple[str, str]]
# (arch, bos_token_id=, eos_token_id=, pad_token_id=) -> a transformers PretrainedConfig
HFConfigFn = Callable[..., Any]


def encode_example(tok, prompt: str, completion: str) -> tuple[list[int], int]:
    """Token ids of prompt + completion, and the prompt's length (the loss starts after it). Encoded
    apart, as an engine sees them: the prompt's ids, then the ids the model writes."""
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    c = tok(completion, add_special_tokens=False)["input_ids"]
    return p + c, len(p)


@dataclass(frozen=True)
class TeacherSpec:
    name: str  # the CLI name, `specexit teacher build NAME`
    assets_dir: Path  # the shipped compact teacher (model.safetensors, teacher.json, build_config.json)
    tokenizer_dir: Path  # one home for the tokenizer: specexit_core/tokenizers/<folder>
    full_vocab_size: int  # embedding rows of the materialised checkpoint
    think_start_id: int
    think_end_id: int
    bos_token: str
    eos_token: str
    pad_token: str
    reasoning_parser: str  # vLLM's `--reasoning-parser` for this template
    hf_architecture: str  # class name in transformers and in vLLM (config.json "architectures")
    think_in_prompt: bool  # the generation prompt already opens `<think>` (R1), or the model does (Qwen3)
    chat_prompt: Callable[[Any, Problem], str]  # (tok, problem) -> the generation prompt's text
    render_example: RenderFn
    hf_config: HFConfigFn
    digits_per_token: int = 1  # how many digits one number token holds (Llama 3 groups up to three)
    build_lr: float | None = None  # the build recipe's peak learning rate; None: TrainRecipe's default
    build_style: RealisticStyle = RealisticStyle()  # how the build recipe's training text is written

    def load_tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.tokenizer_dir))

    def model_class(self) -> type:
        import transformers

        return getattr(transformers, self.hf_architecture)

    def encode_example(self, tok, prompt: str, completion: str) -> tuple[list[int], int]:
        return encode_example(tok, prompt, completion)

    def prompt_ids(self, tok, p: Problem) -> list[int]:
        return tok(self.chat_prompt(tok, p), add_special_tokens=False)["input_ids"]

    def default_arch(self) -> TeacherArch:
        """The built-in teachers' shape (hidden 256, 4 layers; `TeacherArch`) over this vocabulary."""
        from specexit_core.toy.teacher_model import TeacherArch

        return TeacherArch(vocab_size=self.full_vocab_size, max_position_embeddings=1024)
