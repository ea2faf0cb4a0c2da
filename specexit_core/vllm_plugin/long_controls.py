"""Per-request controls of the long mode (n-gram reuse beside EAGLE-3, windowed contextual penalty),
carried in `SamplingParams.extra_args` beside the SpecExit controls.

Offline: `extra_args={"long": {"ngram": True, "ngram_min": 2, "ngram_max": 8, "ngram_policy": "adaptive",
"penalty": {"theta": 1.2, "window": 1024}}}`, `{"long": True}` (the server's long defaults, switched
on) or `{"long": False}`. OpenAI server (`vllm_xargs` values must be flat): `long` (0/1),
`long_ngram` (0/1), `long_ngram_min`, `long_ngram_max`, `long_ngram_policy` (adaptive/always),
`long_penalty_theta`, `long_penalty_window`.

Giving any long control switches the mode on for the request (unless it says `"enabled": false` /
`long: 0`); without one a request gets the server's defaults, which are off unless the deployment
sets `$SPECEXIT_LONG_DEFAULTS` (a JSON object of the same fields; the Serve `long` profile does).
A request without long controls on a server without long defaults runs exactly as before.

Bad names or values raise ValueError; the plugin turns it into vLLM's validation error, so the
OpenAI server answers 400 (controls.install_request_validation).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from specexit_core.longgen.penalty import PenaltyConfig
from specexit_core.typed_config import StrictModel

KEY = "long"
PREFIX = "long_"
# Server-wide long-mode defaults (a JSON object of LongConfig fields), merged under every request.
LONG_DEFAULTS_ENV = "SPECEXIT_LONG_DEFAULTS"
NO_PENALTY = PenaltyConfig(theta=1.0)
_FLAT = {
    "long_enabled": ("enabled",),
    "long_ngram": ("ngram",),
    "long_ngram_min": ("ngram_min",),
    "long_ngram_max": ("ngram_max",),
    "long_ngram_policy": ("ngram_policy",),
    "long_penalty_theta": ("penalty", "theta"),
    "long_penalty_window": ("penalty", "window"),
}
_BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}


class LongConfig(StrictModel):
    """One request's long mode. Lossless by construction: n-gram drafts are deterministic draft
    tokens verified by the target like EAGLE's, and the penalty is part of the target distribution
    (plain decoding with the same penalty is what the output equals)."""

    enabled: bool = False
    ngram: bool = Field(True, description="replace EAGLE-3's drafts by a continuation found in the context")
    ngram_min: int = Field(2, ge=1, le=64, description="shortest suffix of the context that must match earlier")
    ngram_max: int = Field(8, ge=1, le=64, description="longest suffix tried (the longest match wins)")
    ngram_policy: Literal["adaptive", "always"] = Field(
        "adaptive",
        description="adaptive: a full n-gram match replaces EAGLE-3's drafts only while n-gram drafts are "
        "accepted at least as often as EAGLE-3's for this request (ngram_drafts.SourceRates); always: every full match",
    )
    penalty: PenaltyConfig = Field(default_factory=lambda: NO_PENALTY, description="theta 1.0: off")

    @model_validator(mode="after")
    def _order(self):
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"long ngram_min ({self.ngram_min}) > ngram_max ({self.ngram_max})")
        return self

    @property
    def active(self) -> bool:
        """Whether the runner has anything to do for this request."""
        return self.enabled and (self.ngram or self.penalty.enabled)

    def with_overrides(self, overrides: Mapping[str, Any]) -> LongConfig:
        data = self.model_dump()
        for k, v in overrides.items():
            if k == "penalty" and isinstance(v, Mapping):
                data["penalty"] = {**data["penalty"], **v}
            else:
                data[k] = v
        try:
            return LongConfig.model_validate(data)
        except ValidationError as e:
            raise ValueError(_short(e)) from None

    def telemetry(self) -> dict:
        return {
            "ngram": self.ngram,
            "ngram_min": self.ngram_min,
            "ngram_max": self.ngram_max,
            "ngram_policy": self.ngram_policy,
            "penalty": {"theta": self.penalty.theta, "window": self.penalty.window} if self.penalty.enabled else None,
        }


def _short(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'long'}: {err['msg']}" for err in e.errors())


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[v.lower()]
    raise ValueError(f"{name} must be a boolean (true/false/0/1), got {v!r}")


def _number(name: str, v: Any, integer: bool) -> int | float:
    if isinstance(v, bool):
        raise ValueError(f"{name} must be a number, got {v!r}")
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {v!r}") from None
    if not isinstance(v, (int, float)):
        raise ValueError(f"{name} must be a number, got {v!r}")
    if integer:
        if float(v) != int(v):
            raise ValueError(f"{name} must be an integer, got {v!r}")
        return int(v)
    return float(v)


def _coerce(path: tuple[str, ...], v: Any) -> Any:
    name = "long_" + "_".join(path)
    if path in (("enabled",), ("ngram",)):
        return _bool(name, v)
    if path == ("ngram_policy",):
        if v not in ("adaptive", "always"):
            raise ValueError(f"{name} must be 'adaptive' or 'always', got {v!r}")
        return v
    return _number(name, v, integer=path[-1] != "theta")


def overrides_from_extra_args(extra_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The LongConfig overrides a request asks for (nested, validated names, coerced values)."""
    if not extra_args:
        return {}
    out: dict[str, Any] = {}

    def put(path: tuple[str, ...], v: Any) -> None:
        if path == ("penalty",):  # `"penalty": false/null` -> off
            if v is None or v is False:
                out["penalty"] = {"theta": 1.0}
                return
            if not isinstance(v, Mapping):
                raise ValueError(f"long penalty must be an object {{theta, window}} or false, got {v!r}")
            for k, x in v.items():
                if k not in ("theta", "window"):
                    raise ValueError(f"unknown long penalty control {k!r}; known: theta, window")
                put(("penalty", k), x)
            return
        val = _coerce(path, v)
        if len(path) == 2:
            out.setdefault("penalty", {})[path[1]] = val
        else:
            out[path[0]] = val

    given = False
    if KEY in extra_args:
        v = extra_args[KEY]
        if isinstance(v, Mapping):
            known = ("enabled", "ngram", "ngram_min", "ngram_max", "ngram_policy", "penalty")
            for k, x in v.items():
                if k not in known:
                    raise ValueError(f"unknown long-mode control {k!r}; known: {', '.join(known)}")
                put((k,), x)
            given = True
        else:
            out["enabled"] = _bool("long", v)
    for k, v in extra_args.items():
        if not str(k).startswith(PREFIX):
            continue
        if k not in _FLAT:
            raise ValueError(f"unknown long-mode control {k!r}; known: long, {', '.join(_FLAT)}")
        put(_FLAT[k], v)
        given = True
    if given:
        out.setdefault("enabled", True)
    return out


def wants_long(extra_args: Mapping[str, Any] | None) -> bool:
    return bool(extra_args) and any(k == KEY or str(k).startswith(PREFIX) for k in extra_args)


def request_long_config(extra_args: Mapping[str, Any] | None, defaults: LongConfig) -> LongConfig:
    return defaults.with_overrides(overrides_from_extra_args(extra_args))


def server_long_defaults(raw: str | None = None) -> LongConfig:
    """LongConfig() <- $SPECEXIT_LONG_DEFAULTS (a JSON object, nested like the `long` request key)."""
    raw = os.environ.get(LONG_DEFAULTS_ENV) if raw is None else raw
    if not raw:
        return LongConfig()
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"${LONG_DEFAULTS_ENV} is not JSON: {e}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"${LONG_DEFAULTS_ENV} must be a JSON object, got {raw!r}")
    return LongConfig().with_overrides(overrides_from_extra_args({KEY: dict(data)}))
