"""Typed config of the labels job (`python -m pipelines.labels --config FILE`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from pipelines.common.config import EngineConfig, StageBase
from specexit_core.typed_config import StrictModel, resolve_path


class ProbeSampling(StrictModel):
    """k probes per break, sampled at the settings the model is served with: the break's confidence
    label is the fraction of them that answers right (a soft target), not whether one greedy
    continuation happened to be right (issue #44 item 2)."""

    samples: int = Field(4, ge=2)
    temperature: float = Field(0.6, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)  # 0: off (vLLM's meaning)
    seed: int = 0  # per probe: seed + a stable hash of (trace id, break): a rerun draws the same samples


class LabelsConfig(StageBase):
    # keys added after labels were first written, with their defaults (run_identity.config_identity)
    ADDED_KEYS: ClassVar[dict[str, Any]] = {"probe_sampling": None}

    input: str  # traces output folder
    engine: EngineConfig  # the teacher that wrote the traces
    grader: Literal["toy", "numeric", "multiple_choice"] = "toy"
    close_text: str = "</think>\n\n"  # forced after the boundary token
    answer_prompt: str = ""  # then this, e.g. "The final answer is " for real models
    probe_max_tokens: int = Field(16, ge=1)
    probe_sampling: ProbeSampling | None = None  # None: one greedy probe per break (a 0/1 label)
    split_tokens: list[str] | None = None  # None: every single-token paragraph break of the tokenizer
    shift: Literal["next_step", "same_step"] = "next_step"
    initial_confidence: float = Field(0.0, ge=0, le=1)
    chunk_rows: int = Field(32, ge=1)

    def resolve_paths(self) -> LabelsConfig:
        super().resolve_paths()
        self.input = resolve_path(self.input)
        self.engine.resolve_paths()
        return self
