"""Exit settings per sampling profile: which exit a request gets, given how it is sampled.

An exit that keeps accuracy greedy may lose it at T = 0.6 (sampled thinking wanders more), so
`specexit calibrate` chooses one exit per *sampling profile* it calibrates at (temperature, top-p,
top-k) and, as `exit`, one that holds at every one of them. A calibrated file then reads

    {"exit": {...},                                   # holds at every profile below
     "by_profile": {"T0":   {"sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0}, "exit": {...}},
                    "T0.6": {"sampling": {"temperature": 0.6, "top_p": 1.0, "top_k": 0}, "exit": {...}}},
     "calibration": {...}}

A request sampled as one of the profiles gets that profile's exit; any other request gets `exit`, the
more conservative choice (it was chosen to hold at every profile, so it never exits earlier than the
data allowed at any of them). Greedy requests are one profile whatever their top-p / top-k say.
Pure Python: the vLLM plugin, the evaluation and the calibration all read profiles from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GREEDY_BELOW = 1e-5  # vLLM samples greedily below this temperature (`_SAMPLING_EPS`)
_TOL = 1e-6


@dataclass(frozen=True)
class SamplingProfile:
    """How requests are sampled: temperature, nucleus (top-p, 1 = off) and top-k (0 = off)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0

    @classmethod
    def of(cls, temperature: float | None, top_p: float | None = None, top_k: int | None = None) -> SamplingProfile:
        """Normalised: greedy is one profile (top-p / top-k do nothing there); vLLM's "off" values
        (top_k -1 or 0, top_p None or 1) are one value each."""
        t = float(temperature or 0.0)
        p = 1.0 if top_p is None else float(top_p)
        if not (0.0 < p <= 1.0) or math.isnan(t) or t < 0:
            raise ValueError(f"not a sampling profile: temperature {temperature!r}, top_p {top_p!r}")
        if t < GREEDY_BELOW:
            return cls(0.0)
        return cls(t, p, 0 if top_k is None or int(top_k) <= 0 else int(top_k))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplingProfile:
        unknown = set(d) - {"temperature", "top_p", "top_k"}
        if unknown or "temperature" not in d:
            raise ValueError(f"a profile's sampling needs temperature (and top_p, top_k), got {dict(d)}")
        return cls.of(d["temperature"], d.get("top_p"), d.get("top_k"))

    @property
    def name(self) -> str:
        """ "T0", "T0.6", "T0.6-p0.95-k20": the key in `by_profile`."""
        out = f"T{self.temperature:g}"
        if self.top_p < 1.0:
            out += f"-p{self.top_p:g}"
        if self.top_k:
            out += f"-k{self.top_k}"
        return out

    def matches(self, other: SamplingProfile) -> bool:
        return (
            abs(self.temperature - other.temperature) < _TOL
            and abs(self.top_p - other.top_p) < _TOL
            and self.top_k == other.top_k
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What vLLM 0.32's OpenAI endpoint samples a request that names no sampling with, when the model has no
# defaults of its own (`_DEFAULT_SAMPLING_PARAMS` of its chat and completion requests).
VLLM_NEUTRAL_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def served_default_profile(
    model_dir: str | Path, *, generation_config: str = "auto", override: Mapping[str, Any] | None = None
) -> SamplingProfile:
    """The profile vLLM 0.32 serves a request that names no sampling with (`ModelConfig.
    get_diff_sampling_param`): the model folder's `generation_config.json` under `generation_config: auto`
    (vLLM's default; a folder: that folder's; "vllm": none), what differs there from transformers'
    defaults, `override_generation_config` on top; else the endpoint's neutral values. Qwen3 ships
    temperature 0.6, top-p 0.95, top-k 20, which make "T0.6-p0.95-k20"."""
    cfg: dict[str, Any] = {}
    if generation_config != "vllm":
        from transformers import GenerationConfig

        src = model_dir if generation_config == "auto" else generation_config
        try:
            cfg = GenerationConfig.from_pretrained(str(src)).to_diff_dict()
        except OSError:  # no generation_config.json: vLLM's fallback (the model config) sets no sampling
            cfg = {}
    cfg.update(override or {})
    d = {k: v if cfg.get(k) is None else cfg[k] for k, v in VLLM_NEUTRAL_SAMPLING.items()}
    return SamplingProfile.of(d["temperature"], d["top_p"], d["top_k"])


def select_profile(pairs, sampling: SamplingProfile | None, joint: Any) -> tuple[str | None, Any]:
    """The one rule for which exit a request gets: (name, value) of the profile in `pairs` that
    `sampling` matches, else (None, `joint`), the exit that holds at every profile."""
    if sampling is not None:
        for prof, value in pairs:
            if prof.matches(sampling):
                return prof.name, value
    return None, joint


@dataclass(frozen=True)
class ExitProfiles:
    """The exit overrides of a calibrated file: `joint` (its `exit`) and one per profile."""

    joint: dict[str, Any] | None
    profiles: tuple[tuple[SamplingProfile, dict[str, Any]], ...] = ()
    # the reasoning effort levels (efforts.py): (level, its epsilon, its exits shaped like this file)
    efforts: tuple[tuple[str, float | None, ExitProfiles], ...] = ()

    def select(self, sampling: SamplingProfile | None) -> tuple[str | None, dict[str, Any] | None]:
        """(profile name, overrides) for a request sampled so: its profile's exit when one matches,
        else (None, the joint exit). `sampling` None (unknown): the joint exit."""
        return select_profile(self.profiles, sampling, self.joint)


def parse_profiles(data: Any, where: str = "exit setting") -> ExitProfiles:
    """The profiles of a parsed calibrated file (`by_profile`), or none for a file without them or
    a bare mapping of ExitConfig fields (then the whole mapping is the joint exit). ValueError names
    a malformed entry; every profile's exit must itself be a valid setting."""
    from specexit_core.exit.settings import ExitConfig, exit_overrides

    joint = exit_overrides(data, where)
    calibrated = isinstance(data, Mapping) and "exit" in data
    efforts = _parse_efforts(data, where) if calibrated else ()
    by = data.get("by_profile") if calibrated else None
    if by is None:
        return ExitProfiles(joint, (), efforts)
    if not isinstance(by, Mapping):
        raise ValueError(f"{where}: by_profile must be an object of profiles, got {type(by).__name__}")
    out = []
    for name, entry in by.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("sampling"), Mapping):
            raise ValueError(f"{where}: by_profile.{name} needs a 'sampling' object and an 'exit' object")
        try:
            prof = SamplingProfile.from_dict(entry["sampling"])
            ExitConfig().with_overrides(entry.get("exit"))
        except ValueError as e:
            raise ValueError(f"{where}: by_profile.{name}: {e}") from None
        if prof.name != name:
            raise ValueError(f"{where}: by_profile.{name} samples as {prof.name}: the key must be its profile's name")
        out.append((prof, dict(entry["exit"])))
    return ExitProfiles(joint, tuple(out), efforts)


def _parse_efforts(data: Mapping[str, Any], where: str) -> tuple[tuple[str, float | None, ExitProfiles], ...]:
    """A calibrated file's `efforts`: each level an object shaped like the file ({epsilon, exit, by_profile})."""
    from specexit_core.exit.efforts import DEFAULT_EPSILONS

    efforts = data.get("efforts")
    if efforts is None:
        return ()
    if not isinstance(efforts, Mapping):
        raise ValueError(f"{where}: efforts must be an object of levels, got {type(efforts).__name__}")
    out = []
    for level, entry in efforts.items():
        if level not in DEFAULT_EPSILONS:
            raise ValueError(f"{where}: efforts.{level}: the certified levels are {', '.join(DEFAULT_EPSILONS)}")
        if not isinstance(entry, Mapping) or "exit" not in entry:
            raise ValueError(f"{where}: efforts.{level} needs an 'exit' object (and optionally 'by_profile')")
        eps = entry.get("epsilon")
        sub = parse_profiles({k: v for k, v in entry.items() if k != "epsilon"}, f"{where}: efforts.{level}")
        out.append((level, None if eps is None else float(eps), sub))
    return tuple(out)


def load_exit_profiles(source: str | Path) -> ExitProfiles:
    """`parse_profiles` of inline JSON text (starts with "{") or a JSON file (`read_exit_json`)."""
    from specexit_core.exit.settings import read_exit_json

    return parse_profiles(*read_exit_json(source))


@dataclass(frozen=True)
class ExitDefaults:
    """The settings a server merges a request's own overrides with: one per profile any layer names,
    and the joint one for every other request (`resolve_exit_defaults`)."""

    joint: Any  # ExitConfig
    by_profile: tuple[tuple[SamplingProfile, Any], ...] = ()
    # the reasoning effort levels a layer names: (level, epsilon, that level's ExitDefaults)
    by_effort: tuple[tuple[str, float | None, ExitDefaults], ...] = ()

    def select(self, sampling: SamplingProfile | None) -> tuple[str | None, Any]:
        """(profile name or None, ExitConfig) for a request sampled so (None: unknown -> joint)."""
        return select_profile(self.by_profile, sampling, self.joint)

    def for_effort(self, level: str | None) -> tuple[ExitDefaults, dict[str, Any]]:
        """The defaults a request at reasoning effort `level` gets (None: no level asked, these), and
        what to report: {"effort", "served_by", "epsilon"} (efforts.serving_level's rule; `max`: the
        signals never fire, a think budget still holds; a server with no calibrated level serves every
        other level with its own exit, `served_by: default`)."""
        from specexit_core.exit.efforts import NO_EARLY_EXIT, THINKING_OFF, serving_level
        from specexit_core.exit.settings import NEVER_FIRES

        if level is None:
            return self, {}
        served = serving_level(level, (name for name, _, _ in self.by_effort))
        if not self.by_effort and level not in (NO_EARLY_EXIT, THINKING_OFF):  # no level calibrated
            served = "default"  # the server's own exit
        info = {"effort": level, "served_by": served, "epsilon": None}
        if served in (None, "default"):  # `none`: thinking is off in the prompt; or no levels at all
            return self, info
        if served == NO_EARLY_EXIT:
            off = self.joint.with_overrides(NEVER_FIRES)
            return ExitDefaults(off, tuple((p, c.with_overrides(NEVER_FIRES)) for p, c in self.by_profile)), info
        name, eps, defaults = next(e for e in self.by_effort if e[0] == served)
        return defaults, {**info, "epsilon": eps}

    def to_dict(self) -> dict[str, Any]:
        return {"exit": self.joint.to_dict(), "by_profile": {p.name: c.to_dict() for p, c in self.by_profile}}


def resolve_exit_defaults(
    draft_defaults: Mapping[str, Any] | None = None,
    draft_profiles: Mapping[str, Any] | None = None,
    server_env: str | None = None,
    draft_efforts: Mapping[str, Any] | None = None,
) -> ExitDefaults:
    """Each profile's setting, later layers winning, as `resolve_exit_config` does for one: ExitConfig()
    <- the draft's (`exit_profiles` entry for the profile, else `exit_defaults`) <- $SPECEXIT_EXIT_CONFIG's
    (its `by_profile` entry, else its `exit`). A profile named by either layer gets its own setting; a
    layer without that profile contributes its joint exit there. Reasoning effort levels the same way,
    from the draft's `exit_efforts` and the file's `efforts`. ValueError names the bad layer."""
    from specexit_core.exit.settings import EXIT_CONFIG_ENV

    layers: list[tuple[str, ExitProfiles]] = []
    if draft_defaults or draft_profiles or draft_efforts:
        data = {"exit": dict(draft_defaults or {}), "by_profile": dict(draft_profiles or {})}
        if draft_efforts:
            data["efforts"] = dict(draft_efforts)
        layers.append(("draft exit_defaults", parse_profiles(data, "draft exit_profiles")))
    if server_env:
        try:
            layers.append((EXIT_CONFIG_ENV, load_exit_profiles(server_env)))
        except ValueError as e:
            raise ValueError(f"{EXIT_CONFIG_ENV}: {e}") from None
    return _layered(layers)


def _layered(layers: list[tuple[str, ExitProfiles]]) -> ExitDefaults:
    """ExitConfig() with each layer's setting on top, per profile any layer names, and per effort level
    any layer names (from the layers that name it)."""
    from specexit_core.exit.settings import ExitConfig

    names: dict[str, SamplingProfile] = {}
    for _, layer in layers:
        for prof, _ in layer.profiles:
            names.setdefault(prof.name, prof)

    def resolved(prof: SamplingProfile | None) -> Any:
        cfg = ExitConfig()
        for label, layer in layers:
            try:
                cfg = cfg.with_overrides(layer.select(prof)[1] or {})
            except ValueError as e:
                raise ValueError(f"{label}: {e}" if prof is None else f"{label} ({prof.name}): {e}") from None
        return cfg

    levels: dict[str, float | None] = {}
    for _, layer in layers:
        for level, eps, _ in layer.efforts:
            levels[level] = eps  # the last layer naming a level says its epsilon
    efforts = tuple(
        (
            level,
            eps,
            _layered(
                [
                    (f"{label} (effort {level})", sub)
                    for label, layer in layers
                    for lv, _, sub in layer.efforts
                    if lv == level
                ]
            ),
        )
        for level, eps in levels.items()
    )
    return ExitDefaults(resolved(None), tuple((p, resolved(p)) for p in names.values()), efforts)
