"""Typed config of the labels job (`python -m pipelines.labels --config FILE`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipelines.common.config import EngineConfig, StageBase
from specexit_core.typed_config import resolve_path


class LabelsConfig(StageBase):
    input: str  # traces output folder
    engine: EngineConfig  # the teacher that wrote the traces
    grader: Literal["toy", "numeric", "multiple_choice"] = "toy"
    close_text: str = "</think>\n\n"  # forced after the boundary token
    answer_prompt: str = ""  # then this, e.g. "The final answer is " for real models
    probe_max_tokens: int = Field(16, ge=1)
    split_tokens: list[str] | None = None  # None: every single-token paragraph break of the tokenizer
    shift: Literal["next_step", "same_step"] = "next_step"
    initial_confidence: float = Field(0.0, ge=0, le=1)
    chunk_rows: int = Field(32, ge=1)

    def resolve_paths(self) -> LabelsConfig:
        super().resolve_paths()
        self.input = resolve_path(self.input)
        self.engine.resolve_paths()
        return self
