"""Per-request SpecExit controls carried in `SamplingParams.extra_args`.

Offline: `SamplingParams(extra_args={"specexit": {"confidence_threshold": 0.9}})` or
`{"specexit": False}`. OpenAI server (values must be flat): `"vllm_xargs": {"specexit_enabled": 0,
"specexit_method": "progress", "specexit_confidence_threshold": 0.9, ...}`. Any field of
`ExitConfig` may be set. Bad values raise `VLLMValidationError` while the request is built, so
the OpenAI server answers 400 and the engine never sees them. They are checked against the same
defaults the worker merges them with (`frontend_defaults`: the SpecExit draft of the engine this
process built <- $SPECEXIT_EXIT_CONFIG), so e.g. a request budget below the server's
`min_think_tokens` is a 400, not an error inside the engine.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from specexit_core.draft.config import read_specexit_fields
from specexit_core.exit import EXIT_CONFIG_ENV, ExitConfig, resolve_exit_config

PREFIX = "specexit_"
KEY = "specexit"
FIELDS = tuple(ExitConfig.model_fields)
_BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}


def _coerce(name: str, value: Any) -> Any:
    """JSON/xargs values arrive as str/int/float: turn them into what ExitConfig expects."""
    if name == "enabled":
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        raise ValueError(f"specexit_enabled must be a boolean (true/false/0/1), got {value!r}")
    if name == "max_think_tokens" and (value is None or value == "none"):
        return None
    if name in ("min_think_tokens", "max_think_tokens") and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and name != "method":
        try:
            num = float(value)
        except ValueError:
            raise ValueError(f"specexit_{name} must be a number, got {value!r}") from None
        return int(num) if name.endswith("_tokens") and num.is_integer() else num
    return value


def overrides_from_extra_args(extra_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ExitConfig overrides a request asks for (validated names, coerced values)."""
    if not extra_args:
        return {}
    out: dict[str, Any] = {}
    if KEY in extra_args:
        v = extra_args[KEY]
        if isinstance(v, Mapping):
            for k, x in v.items():
                if k not in FIELDS:
                    raise ValueError(f"unknown SpecExit control {k!r}; known: {', '.join(FIELDS)}")
                out[k] = _coerce(k, x)
        else:
            out["enabled"] = _coerce("enabled", v)
    for k, v in extra_args.items():
        if not k.startswith(PREFIX):
            continue
        name = k[len(PREFIX):]
        if name not in FIELDS:
            raise ValueError(f"unknown SpecExit control {k!r}; known: {', '.join(PREFIX + f for f in FIELDS)}")
        out[name] = _coerce(name, v)
    return out


def request_exit_config(extra_args: Mapping[str, Any] | None, defaults: ExitConfig) -> ExitConfig:
    return defaults.with_overrides(overrides_from_extra_args(extra_args))


def server_defaults(draft_exit_defaults: Mapping[str, Any] | None = None) -> ExitConfig:
    """This server's defaults: ExitConfig() <- the draft's `exit_defaults` <- $SPECEXIT_EXIT_CONFIG
    (a JSON object, or a path to a JSON file such as the one `specexit calibrate` writes).
    Requests override them (`request_exit_config`)."""
    return resolve_exit_config(draft_exit_defaults, os.environ.get(EXIT_CONFIG_ENV))


_draft_exit_defaults: dict[str, Any] | None = None  # of the SpecExit draft of the engine built here


def remember_draft_defaults(speculative_config) -> None:
    """Record the `exit_defaults` of an engine's SpecExit draft (called as its VllmConfig is built,
    in the front-end process), so requests are validated against what the worker will merge."""
    global _draft_exit_defaults
    from specexit_core.vllm_plugin.runner_choice import is_specexit_draft

    if not is_specexit_draft(speculative_config):
        return
    hf = getattr(getattr(speculative_config, "draft_model_config", None), "hf_config", None)
    if hf is not None:
        _draft_exit_defaults = read_specexit_fields(hf).exit_defaults


def frontend_defaults() -> ExitConfig:
    """The defaults the worker resolves (`server_defaults` with the draft's exit_defaults); plain
    ExitConfig() if they cannot be resolved (the engine then fails at start-up with the reason)."""
    try:
        return server_defaults(_draft_exit_defaults)
    except ValueError:
        return ExitConfig()


def install_request_validation() -> None:
    """Validate SpecExit controls when SamplingParams are built (front-end process)."""
    from vllm.config import VllmConfig
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    if getattr(SamplingParams, "_specexit_patched", False):
        return
    orig = SamplingParams._verify_args

    def _verify_args(self) -> None:
        orig(self)
        if self.extra_args and any(k == KEY or str(k).startswith(PREFIX) for k in self.extra_args):
            try:
                request_exit_config(self.extra_args, frontend_defaults())
            except ValueError as e:
                raise VLLMValidationError(f"invalid SpecExit control: {e}", parameter="vllm_xargs") from None

    SamplingParams._verify_args = _verify_args
    SamplingParams._specexit_patched = True

    orig_post_init = VllmConfig.__post_init__

    def __post_init__(self, *args, **kwargs):
        orig_post_init(self, *args, **kwargs)
        remember_draft_defaults(getattr(self, "speculative_config", None))

    VllmConfig.__post_init__ = __post_init__
