"""The exit settings: `ExitConfig` (defaults = the paper's), the never-fires setting, calibrated
files, and how draft defaults, the server environment and a request combine.

Pure Python (pydantic, no torch): the vLLM plugin, the Serve front end, the pipelines and the
reference engine all read the settings from here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import ConfigDict, ValidationError, field_validator, model_validator

from specexit_core.exit.signal_names import parse_method
from specexit_core.typed_config import StrictModel

# The server-wide exit setting of the vLLM plugin: inline JSON or the path of a JSON file (such
# as the one `specexit calibrate` writes).
EXIT_CONFIG_ENV = "SPECEXIT_EXIT_CONFIG"

# Overrides under which the signals can never trigger an exit: smoothed confidence is a mean of
# sigmoids, never > 1. Only a `max_think_tokens` budget can then end thinking (the `budget` method,
# the "cost of the machinery" bench run, calibration's replay that records every check).
NEVER_FIRES: Mapping[str, Any] = MappingProxyType({"method": "confidence", "confidence_threshold": 1.0})

_FLOATS = ("confidence_threshold", "progress_threshold", "remaining_threshold", "alpha")
_INTS = ("min_think_tokens", "max_think_tokens", "answer_reserve_tokens")


def _typed(name: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    # bool is an int subclass, but `true` as a threshold or count is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    return value


class ExitConfig(StrictModel):
    """Early-exit settings; defaults are the paper's.  ``enabled=False`` turns off
    everything, the ``max_think_tokens`` budget and the answer reserve included, so "off" means
    plain decoding."""

    model_config = ConfigDict(frozen=True)  # merged with StrictModel's (extra="forbid", ...)

    enabled: bool = True
    method: str = "confidence_progress_remain"
    confidence_threshold: float = 0.8  # exit needs smoothed confidence > this
    progress_threshold: float = 0.3  # ... and smoothed progress > this
    remaining_threshold: float = 200.0  # ... and smoothed remaining < this
    alpha: float = 0.1  # EWMA weight of the newest value
    min_think_tokens: int = 0  # no signal exit before this many think tokens
    max_think_tokens: int | None = None  # hard budget: exit right after this many
    # never an empty answer: thinking ends early enough to leave this many tokens of max_tokens to
    # the answer (answer_reserve.py; 0 = off)
    answer_reserve_tokens: int = 16

    # -- types first (mode="before": pydantic's lax coercion would accept "0.8", True, 3.0) -----
    @field_validator("enabled", mode="before")
    @classmethod
    def _enabled_is_bool(cls, v: Any) -> bool:
        if not isinstance(v, bool):
            raise ValueError(f"enabled must be true or false, got {v!r}")
        return v

    @field_validator("method", mode="before")
    @classmethod
    def _method_names_signals(cls, v: Any) -> str:
        parse_method(v)
        return v

    @field_validator(*_FLOATS, mode="before")
    @classmethod
    def _is_number(cls, v: Any, info) -> float:
        # ints -> float, so to_dict() round-trips equal
        return float(_typed(info.field_name, v, (int, float)))

    @field_validator(*_INTS, mode="before")
    @classmethod
    def _is_integer(cls, v: Any, info) -> int | None:
        if v is None and info.field_name == "max_think_tokens":
            return None
        return _typed(info.field_name, v, int)

    # -- then ranges -----------------------------------------------------------------------------
    @field_validator("confidence_threshold", "progress_threshold")
    @classmethod
    def _in_unit_interval(cls, v: float, info) -> float:
        if not 0.0 <= v <= 1.0:  # also rejects NaN
            raise ValueError(f"{info.field_name} must be in [0, 1], got {v}")
        return v

    @field_validator("remaining_threshold")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not v > 0.0:
            raise ValueError(f"remaining_threshold must be > 0, got {v}")
        return v

    @field_validator("alpha")
    @classmethod
    def _alpha_range(cls, v: float) -> float:
        if not 0.0 < v <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {v}")
        return v

    @field_validator("min_think_tokens", "answer_reserve_tokens")
    @classmethod
    def _non_negative(cls, v: int, info) -> int:
        if v < 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {v}")
        return v

    @field_validator("max_think_tokens")
    @classmethod
    def _budget_positive(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"max_think_tokens must be >= 1 or null, got {v}")
        return v

    @model_validator(mode="after")
    def _budget_after_minimum(self) -> ExitConfig:
        if self.max_think_tokens is not None and self.max_think_tokens < self.min_think_tokens:
            raise ValueError(
                f"max_think_tokens ({self.max_think_tokens}) must be >= min_think_tokens ({self.min_think_tokens})"
            )
        return self

    # -- API -------------------------------------------------------------------------------------
    @property
    def signals_used(self) -> tuple[str, ...]:
        return parse_method(self.method)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExitConfig:
        return cls().with_overrides(d)

    def with_overrides(self, d: Mapping[str, Any] | None) -> ExitConfig:
        """A copy with the keys of ``d`` replaced (per-request overrides from HTTP), re-validated.
        Errors are plain ValueErrors with one clear sentence per problem: the vLLM plugin and the
        Serve front end answer HTTP 400 with them."""
        if d is None:
            return self
        if not isinstance(d, Mapping):
            raise ValueError(f"exit config overrides must be an object, got {type(d).__name__}")
        known = list(type(self).model_fields)
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise ValueError(f"unknown exit config key(s): {', '.join(unknown)} (known keys: {', '.join(known)})")
        try:
            return type(self).model_validate({**self.to_dict(), **dict(d)})
        except ValidationError as e:
            raise ValueError(_plain_messages(e)) from None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def _plain_messages(e: ValidationError) -> str:
    """Our validators' own sentences (they name the field), without pydantic's framing."""
    out = []
    for err in e.errors():
        if err["type"] == "value_error":
            out.append(str(err["ctx"]["error"]))
        else:
            out.append(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}")
    return "; ".join(out)


def exit_overrides(data: Any, where: str = "exit setting") -> dict[str, Any]:
    """The ExitConfig overrides in a parsed JSON value: a calibrated file's `{"exit": {...},
    "calibration": {...}}` or a bare mapping of ExitConfig fields."""
    if isinstance(data, Mapping) and "exit" in data:
        data = data["exit"]
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object of exit settings, got {type(data).__name__}")
    return dict(data)


def read_exit_json(source: str | Path) -> tuple[Any, str]:
    """(parsed JSON, where it came from) of an exit setting given as inline JSON text (starts with
    "{") or as a JSON file (such as the one `specexit calibrate` writes). ValueError if not JSON."""
    text = source if isinstance(source, str) and source.lstrip().startswith("{") else Path(source).read_text()
    where = "inline exit setting" if text is source else str(source)
    try:
        return json.loads(text), where
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None


def load_exit_overrides(source: str | Path) -> dict[str, Any]:
    """ExitConfig overrides from inline JSON text or a JSON file (`read_exit_json`); both forms of
    `exit_overrides` are accepted."""
    return exit_overrides(*read_exit_json(source))


def resolve_exit_config(
    draft_defaults: Mapping[str, Any] | None = None,
    server_env: str | None = None,
    request: Mapping[str, Any] | None = None,
) -> ExitConfig:
    """The effective exit setting, later layers winning: ExitConfig() (the paper's defaults) <- the
    draft's `exit_defaults` <- `server_env` (the value of $SPECEXIT_EXIT_CONFIG: inline JSON or a
    file) <- the request's overrides."""
    cfg = ExitConfig()
    if draft_defaults:
        try:
            cfg = cfg.with_overrides(draft_defaults)
        except ValueError as e:
            raise ValueError(f"draft exit_defaults: {e}") from None
    if server_env:
        try:
            cfg = cfg.with_overrides(load_exit_overrides(server_env))
        except ValueError as e:
            raise ValueError(f"{EXIT_CONFIG_ENV}: {e}") from None
    return cfg.with_overrides(request)
