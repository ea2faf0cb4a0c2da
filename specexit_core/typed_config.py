"""The one config style of the project: strict pydantic models, one loader, one path rule.

Every run config (pipeline stages, evaluation, calibration, the demo, the Serve app) and the exit
settings are `StrictModel`s: unknown keys are errors that name the key, so a typo in a YAML file
fails at load time instead of being silently ignored. `load_config` is the only YAML reader: file
(or dict) -> command-line overrides -> validation -> `resolve_paths()`, every failure one
`ConfigError`.

Paths follow one rule (`resolve_path`): relative local paths are made absolute against
`$SPECEXIT_ROOT`, else the working directory, in the process that reads the config (Ray workers and
Serve replicas run elsewhere); URIs (`s3://...`) pass through unchanged. Model references
(`toy:teacher`, `teacher:NAME`, hub ids) build on it in `specexit_core.teachers.model_ref`, next to
the models they name.

This module imports nothing of the project (an import-linter contract in pyproject.toml): it is the
foundation every config, the models' own included, stands on.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

# Relative paths in configs and overrides resolve against this directory when it is set. Under
# `ray job submit --working-dir .` the job runs in an unpacked copy of the working dir, so a
# relative `runs/toy/traces` would land in that copy; set SPECEXIT_ROOT to the real checkout
# (or to shared storage) to keep outputs where the next job finds them.
ROOT_ENV = "SPECEXIT_ROOT"


class StrictModel(BaseModel):
    """Base of every typed config: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def resolve_paths(self):
        """Called by `load_config` after validation; configs that name files or models override it
        to apply `resolve_path` (or `teachers.model_ref.resolve_model`) to them. Returns the config."""
        return self


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and every bad key."""


M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (anything else is a ConfigError)."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def load_config(
    model: type[M],
    path: str | Path | None = None,
    *,
    raw: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    what: str | None = None,
) -> M:
    """Validate a YAML file (or a dict) as `model`; raises ConfigError naming every problem.

    `raw` is the data itself (when `path` is given too, it only names the source in messages).
    `overrides` are applied before validation: a dotted key sets a nested one (`input.path`,
    `eval.limit`); None values are skipped, so unset command-line flags can be passed as they are.
    Then `resolve_paths()` makes the config's paths absolute (see the module docstring)."""
    data = copy.deepcopy(dict(raw)) if raw is not None else read_yaml(path) if path is not None else {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    name = what or model.__name__
    try:
        cfg = model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"invalid {name} config{f' {path}' if path else ''}:\n{e}") from None
    resolve = getattr(cfg, "resolve_paths", None)
    try:
        return resolve() if resolve is not None else cfg
    except ValidationError as e:  # a resolved path failed a field's check
        raise ConfigError(f"invalid {name} config{f' {path}' if path else ''}:\n{e}") from None


def _set_dotted(data: dict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for p in parents:
        child = data.get(p)
        data[p] = dict(child) if isinstance(child, Mapping) else {}
        data = data[p]
    data[leaf] = value


# -- the path rule ---------------------------------------------------------------------------------
def base_dir() -> Path:
    """What relative paths are relative to: $SPECEXIT_ROOT, else the working directory."""
    return Path(os.environ.get(ROOT_ENV) or os.getcwd())


def resolve_path(p: str | None) -> str | None:
    """A local path (input, output, checkpoint folder) made absolute against `base_dir()`; URIs
    pass through."""
    if p is None or "://" in p:
        return p
    path = Path(p).expanduser()
    return str(path if path.is_absolute() else (base_dir() / path).resolve())
