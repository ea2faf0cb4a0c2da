"""Typed config of the traces job (`python -m pipelines.traces --config FILE`), and where prompts
come from (`InputConfig`, also the evaluation's problem set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from pipelines.common.config import EngineConfig, SamplingConfig, StageBase
from specexit_core.typed_config import ConfigError, StrictModel, resolve_path


class InputConfig(StrictModel):
    """Where prompts come from (traces stage)."""

    kind: Literal["toy", "jsonl", "parquet", "hf_disk", "hf_hub"] = "toy"
    path: str | None = None  # file / folder / glob (jsonl, parquet), folder (hf_disk), dataset name (hf_hub)
    split: str = "train"  # toy split or HF split
    hf_config_name: str | None = None  # HF hub dataset config, e.g. "main" for gsm8k
    n: int = Field(256, ge=1)  # toy: number of problems
    seed: int = 0  # toy: problem stream seed
    id_column: str | None = "id"  # used when the data has it; otherwise ids are row-<index>
    prompt_column: str = "prompt"
    gold_column: str | None = None  # gold answer column (toy: always filled)
    choices_column: str | None = None  # multiple choice: list of options, appended as "A. ..."

    @model_validator(mode="after")
    def _need_path(self):
        if self.kind != "toy" and not self.path:
            raise ValueError(f"input.kind={self.kind!r} needs input.path")
        return self

    def resolve_paths(self) -> InputConfig:
        if self.path and self.kind != "hf_hub":  # an hf_hub path is a dataset name
            self.path = resolve_path(self.path)
        return self


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


def input_overrides(path: str | None) -> dict[str, str]:
    """`--input PATH` as `load_config` overrides: the path, and the reader its name implies."""
    return {} if path is None else {"input.path": path, "input.kind": infer_input_kind(path)}


def infer_input_kind(path: str) -> str:
    """`--input` for the traces stage: pick the reader from the path."""
    p = Path(resolve_path(path))
    if p.suffix in (".jsonl", ".json") or p.name.endswith(".jsonl.gz"):
        return "jsonl"
    if p.suffix == ".parquet":
        return "parquet"
    if p.is_dir():
        if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            return "hf_disk"
        if any(p.glob("*.parquet")):
            return "parquet"
        if any(p.glob("*.jsonl")):
            return "jsonl"
    raise ConfigError(f"cannot tell the input kind of {path!r}; set input.kind in the config")
