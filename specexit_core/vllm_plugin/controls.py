"""Per-request SpecExit controls carried in `SamplingParams.extra_args`.

Offline: `SamplingParams(extra_args={"specexit": {"confidence_threshold": 0.9}})` or
`{"specexit": False}`. OpenAI server (values must be flat): `"vllm_xargs": {"specexit_enabled": 0,
"specexit_method": "progress", "specexit_confidence_threshold": 0.9, ...}`. Any field of
`ExitConfig` may be set. Bad values raise `VLLMValidationError` while the request is built, so
the OpenAI server answers 400 and the engine never sees them. At submission they are also checked
against the defaults the worker merges them with (`engine_defaults`: the engine's SpecExit draft
<- $SPECEXIT_EXIT_CONFIG), so e.g. a request budget below the server's `min_think_tokens` is a
400, not an error inside the engine. The long mode's controls (`long`, `long_*`: long_controls.py)
are validated here too; a request asking for it on an engine without a SpecExit draft is a 400.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from specexit_core.draft.config import read_specexit_fields
from specexit_core.exit import EXIT_CONFIG_ENV, ExitConfig
from specexit_core.exit.efforts import EFFORT_CONTROL, parse_effort
from specexit_core.exit.profiles import ExitDefaults, SamplingProfile, resolve_exit_defaults
from specexit_core.vllm_plugin.long_controls import LongConfig, request_long_config, wants_long

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
    if name.endswith("_tokens") and isinstance(value, float) and value.is_integer():
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
        if not k.startswith(PREFIX) or k == EFFORT_CONTROL:  # the level picks the defaults: request_effort
            continue
        name = k[len(PREFIX) :]
        if name not in FIELDS:
            raise ValueError(f"unknown SpecExit control {k!r}; known: {', '.join(PREFIX + f for f in FIELDS)}")
        out[name] = _coerce(name, v)
    return out


def request_exit_config(
    extra_args: Mapping[str, Any] | None, defaults: ExitConfig | ExitDefaults, sampling: SamplingProfile | None = None
) -> ExitConfig:
    """A request's setting: its overrides on the defaults (per reasoning effort: its level's, see
    `request_effort`; per sampling profile: those of the profile it is sampled as, else the joint
    ones; `sampling_profile`)."""
    if isinstance(defaults, ExitDefaults):
        defaults = defaults.for_effort(request_effort(extra_args))[0].select(sampling)[1]
    return defaults.with_overrides(overrides_from_extra_args(extra_args))


def request_effort(extra_args: Mapping[str, Any] | None) -> str | None:
    """The reasoning effort level a request asks for (`specexit_effort`; the Serve endpoint sets it
    from `reasoning_effort`), or None. ValueError naming the levels."""
    v = (extra_args or {}).get(EFFORT_CONTROL)
    return None if v is None else parse_effort(v)


def sampling_profile(params) -> SamplingProfile | None:
    """The profile a request is sampled as (SamplingParams, or an OpenAI request with temperature /
    top_p / top_k); None when its sampling cannot be read or is left to the server (an OpenAI request
    without a temperature): it then gets the joint defaults."""
    if getattr(params, "temperature", None) is None:
        return None
    try:
        return SamplingProfile.of(
            getattr(params, "temperature", None), getattr(params, "top_p", None), getattr(params, "top_k", None)
        )
    except (TypeError, ValueError):
        return None


def server_defaults(
    draft_exit_defaults: Mapping[str, Any] | None = None,
    draft_exit_profiles: Mapping[str, Any] | None = None,
    draft_exit_efforts: Mapping[str, Any] | None = None,
) -> ExitDefaults:
    """This server's defaults, per sampling profile: ExitConfig() <- the draft's `exit_defaults` (or its
    `exit_profiles` entry) <- $SPECEXIT_EXIT_CONFIG (a JSON object, or a path to a JSON file such as the
    one `specexit calibrate` writes, whose `by_profile` entries win for their profiles). Requests
    override them (`request_exit_config`)."""
    return resolve_exit_defaults(
        draft_exit_defaults, draft_exit_profiles, os.environ.get(EXIT_CONFIG_ENV), draft_exit_efforts
    )


def engine_defaults(vllm_config) -> ExitDefaults | None:
    """The defaults an engine's worker merges requests with (`server_defaults` with its SpecExit
    draft's exit_defaults), or None for an engine without a SpecExit draft."""
    from specexit_core.vllm_plugin.runner_choice import is_specexit_draft

    spec = getattr(vllm_config, "speculative_config", None)
    if not is_specexit_draft(spec):
        return None
    hf = getattr(getattr(spec, "draft_model_config", None), "hf_config", None)
    fields = read_specexit_fields(hf) if hf is not None else None
    return server_defaults(
        fields and fields.exit_defaults, fields and fields.exit_profiles, fields and fields.exit_efforts
    )


def _has_specexit_draft(vllm_config) -> bool:
    from specexit_core.vllm_plugin.runner_choice import is_specexit_draft

    return is_specexit_draft(getattr(vllm_config, "speculative_config", None))


def install_request_validation() -> None:
    """Validate SpecExit controls in the front end: names and values when SamplingParams are built
    (against ExitConfig(): the same check in every process, since the engine core rebuilds the
    params when it decodes them and must never raise there), then against the engine's resolved
    defaults when the request is submitted (`InputProcessor._validate_params`, front end only)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    if getattr(SamplingParams, "_specexit_patched", False):
        return

    def _check(extra_args, defaults: ExitConfig | ExitDefaults, sampling: SamplingProfile | None = None) -> None:
        if extra_args and any(k == KEY or str(k).startswith(PREFIX) for k in extra_args):
            try:
                request_effort(extra_args)  # a level is checked wherever the defaults are a plain setting too
                request_exit_config(extra_args, defaults, sampling)
            except ValueError as e:
                raise VLLMValidationError(f"invalid SpecExit control: {e}", parameter="vllm_xargs") from None
        if wants_long(extra_args):
            try:
                request_long_config(extra_args, LongConfig())
            except ValueError as e:
                raise VLLMValidationError(f"invalid long-mode control: {e}", parameter="vllm_xargs") from None

    orig_verify = SamplingParams._verify_args

    def _verify_args(self) -> None:
        orig_verify(self)
        _check(self.extra_args, ExitConfig())

    orig_validate = InputProcessor._validate_params

    def _validate_params(self, params, *args, **kwargs):
        out = orig_validate(self, params, *args, **kwargs)
        if isinstance(params, SamplingParams) and params.extra_args:
            try:
                defaults = engine_defaults(self.vllm_config)
            except ValueError:
                defaults = None  # a bad $SPECEXIT_EXIT_CONFIG: the engine reports it at start-up
            if defaults is not None:
                _check(params.extra_args, defaults, sampling_profile(params))
            elif wants_long(params.extra_args) and not _has_specexit_draft(self.vllm_config):
                raise VLLMValidationError(
                    "the long mode needs an engine with a SpecExit draft (its runner hook); this engine has none",
                    parameter="vllm_xargs",
                )
        return out

    SamplingParams._verify_args = _verify_args
    SamplingParams._specexit_patched = True
    InputProcessor._validate_params = _validate_params
