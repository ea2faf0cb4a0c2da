"""Special token ids the stages need, looked up once from the model's tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

# Step-split (paragraph-break) tokens: the one definition, shared with the engines.
from specexit_core.exit.split_tokens import single_token_id, split_token_ids


@dataclass(frozen=True)
class TokenIds:
    think_start: int
    think_end: int
    split: tuple[int, ...]
    eos: tuple[int, ...]
    pad: int

    def to_dict(self) -> dict:
        return {
            "think_start": self.think_start,
            "think_end": self.think_end,
            "split": list(self.split),
            "eos": list(self.eos),
            "pad": self.pad,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TokenIds:
        return cls(d["think_start"], d["think_end"], tuple(d["split"]), tuple(d["eos"]), d["pad"])


def eos_ids(tok, model_dir: str | None = None) -> tuple[int, ...]:
    ids = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    if model_dir is not None:  # generation_config may list more (Qwen3: <|im_end|> and <|endoftext|>)
        try:
            from transformers import GenerationConfig

            e = GenerationConfig.from_pretrained(model_dir).eos_token_id
            ids.update([e] if isinstance(e, int) else list(e or []))
        except Exception:
            pass
    return tuple(sorted(ids))


def token_ids(
    tok, *, think_start: str, think_end: str, split_tokens: list[str] | None = None, model_dir: str | None = None
) -> TokenIds:
    eos = eos_ids(tok, model_dir)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    return TokenIds(
        think_start=single_token_id(tok, think_start, "think_start"),
        think_end=single_token_id(tok, think_end, "think_end"),
        split=split_token_ids(tok, split_tokens),
        eos=eos,
        pad=int(pad),
    )


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def think_opened(prompt_ids: list[int], think_start: int, think_end: int) -> bool:
    """Did the chat template open the think segment (Qwen3-Thinking, R1-distill templates do)?"""

    def last(x: int) -> int:
        return len(prompt_ids) - 1 - prompt_ids[::-1].index(x) if x in prompt_ids else -1

    return last(think_start) > last(think_end)
