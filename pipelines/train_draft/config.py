"""Typed config of the draft-training job (`python -m pipelines.train_draft --config FILE`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from pipelines.common.config import TrainRunBase
from specexit_core.teachers.model_ref import resolve_model


class TrainDraftConfig(TrainRunBase):
    """input: the labels output folder; output: the exported SpecExit draft folder."""

    RUN_ONLY_KEYS: ClassVar[frozenset[str]] = TrainRunBase.RUN_ONLY_KEYS | {"init_draft", "bf16_autocast", "recompute"}
    # keys added after runs were first written, with their defaults (run_identity.config_identity)
    ADDED_KEYS: ClassVar[dict[str, object]] = {"signal_weight": 1.0, "end_weight": 1.0}

    aux_layer_ids: tuple[int, int, int] | None = None  # None: vLLM's default (2, L//2, L-3)
    draft_vocab_size: int | None = Field(None, ge=1)  # required unless init_draft gives it
    # Start from an existing EAGLE-3 draft of this target (the usual case for real models: a
    # published EAGLE-3 head): a stock one gets zero signal rows (`specexit draft convert
    # --add-signals`), a SpecExit one is fine-tuned as is. Its draft vocab and aux layers are kept.
    init_draft: str | None = None
    # The decoder layer of a new draft (init_draft keeps its own): "llama", the EAGLE-3 paper's, or
    # "qwen3", Qwen3's (q/k norms), which vLLM runs as Eagle3Qwen3ForCausalLM (docs/draft_formats.md)
    layer: str = "llama"
    include_embed: bool = True  # False: vLLM shares the target's embedding (saves a V x H tensor)
    steps: int = Field(100, ge=1)
    batch_size: int = Field(8, ge=1)  # per worker
    max_seq_len: int | None = Field(None, ge=8)  # truncate prompt + completion
    # Batches drawn at a time and regrouped by length (1: off): they pad less, and every worker
    # takes the same length rank at the same step (specexit_core/training/length_buckets.py).
    length_buckets: int = Field(1, ge=1)
    lr: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(10, ge=1)
    unroll: int = Field(7, ge=1)
    weighting: Literal["uncertainty", "ratio", "fixed"] = "uncertainty"
    # With `weighting: fixed`, each signal loss's weight against the token loss (#44 item 3's lever)
    signal_weight: float = Field(1.0, ge=0)
    # The confidence loss of the think tokens in the second half of the thinking (progress label >=
    # training.loss.END_FROM) weighs this much against the first half's (1: alike): the breaks near the end,
    # where the exit decides, against the many early ones (#44 item 3's balancing lever)
    end_weight: float = Field(1.0, gt=0)
    # Memory of the draft step ("auto": on when the workers train on GPUs; docs/runbook.md, "Draft
    # training memory and time"): bf16 autocast for the draft (weights, gradients and AdamW state stay fp32),
    # and recomputing each unroll step's decoder layer in backward instead of keeping it.
    bf16_autocast: bool | Literal["auto"] = "auto"
    recompute: bool | Literal["auto"] = "auto"
    grad_clip: float = Field(1.0, gt=0)
    seed: int = 0
    think_start: str = "<think>"
    think_end: str = "</think>"
    split_tokens: list[str] | None = None  # always in the draft vocab; None: auto (as labels)

    @field_validator("layer")
    @classmethod
    def _known_layer(cls, v):
        from specexit_core.draft.config import check_layer  # lazy: specexit_core.draft imports torch

        return check_layer(v)

    @field_validator("aux_layer_ids")
    @classmethod
    def _distinct(cls, v):
        if v is not None and (len(set(v)) != 3 or min(v) < 0):
            raise ValueError(f"aux_layer_ids must be 3 distinct non-negative ids, got {v}")
        return v

    @model_validator(mode="after")
    def _signal_weight_with_fixed(self):
        if self.signal_weight != 1.0 and self.weighting != "fixed":
            raise ValueError(f"signal_weight applies with weighting: fixed (weighting is {self.weighting!r})")
        return self

    @model_validator(mode="after")
    def _vocab_source(self):
        if self.draft_vocab_size is None and self.init_draft is None:
            raise ValueError("set draft_vocab_size (a new draft) or init_draft (fine-tune an existing one)")
        return self

    def resolve_paths(self) -> TrainDraftConfig:
        super().resolve_paths()
        self.init_draft = resolve_model(self.init_draft)
        return self
