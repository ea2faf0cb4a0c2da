"""Typed config of the traces job (`python -m pipelines.traces --config FILE`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pipelines.common.config import EngineConfig, SamplingConfig, StageBase
from pipelines.common.prompt_source import InputConfig


class TracesConfig(StageBase):
    input: InputConfig = Field(default_factory=InputConfig)
    engine: EngineConfig
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    system_prompt: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    def resolve_paths(self) -> TracesConfig:
        super().resolve_paths()
        self.input.resolve_paths()
        self.engine.resolve_paths()
        return self
