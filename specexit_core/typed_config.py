"""The one config style of the project: strict pydantic models, one loader, one path rule.

Every run config (pipeline stages, evaluation, calibration, the demo, the Serve app) and the exit
settings are `StrictModel`s: unknown keys are errors that name the key, so a typo in a YAML file
fails at load time instead of being silently ignored. `load_config` is the only YAML reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class StrictModel(BaseModel):
    """Base of every typed config: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and every bad key."""


M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (anything else is a ConfigError)."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def load_config(model: type[M], path: str | Path | None = None, *, raw: Mapping[str, Any] | None = None,
                what: str | None = None) -> M:
    """Validate a YAML file (or a dict) as `model`; raises ConfigError naming every problem."""
    data = read_yaml(path) if path is not None else dict(raw or {})
    try:
        return model.model_validate(data)
    except ValidationError as e:
        name = what or model.__name__
        raise ConfigError(f"invalid {name} config{f' {path}' if path else ''}:\n{e}") from None
