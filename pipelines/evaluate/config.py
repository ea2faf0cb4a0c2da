"""Typed configs of the evaluation and calibration jobs (a documented recipe each; unknown keys are errors).

`EvalConfig` is what `python -m pipelines.evaluate --config FILE` reads and what
`pipelines.evaluate.run_evaluation(cfg)` takes; `CalibrateConfig` wraps one for
`specexit calibrate`. The peer-method knobs follow `notes/specexit-method.md`; the toy values
(`examples/toy/evaluate.yaml`) replace the real-model probe text (`**Final Answer** \\boxed{`)
with what the toy tokenizer can say (`</think>` + "The answer is").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from pipelines.common.config import ConfigError, EngineConfig, InputConfig, RayConfig, _Strict, resolve_model, resolve_path

METHODS = ("plain", "eagle3", "specexit", "specexit_default", "budget", "deer", "dynasor", "nothink", "oracle")


class DeerConfig(_Strict):
    """DEER (arXiv 2504.15895): at each transition word, a trial answer; exit if it is confident."""

    transition_words: list[str] = Field(default_factory=lambda: ["Wait"])  # single tokens (with/without space)
    probe_text: str = "\n**Final Answer**\n\\boxed"  # appended after the prefix for the trial answer
    trial_max_tokens: int = Field(20, ge=1)
    skip_first: bool = True  # DEER skips the first trial token (the `{` of \boxed{)
    mean: Literal["arithmetic", "geometric"] = "arithmetic"  # R1: arithmetic, Qwen3: geometric
    threshold: float = Field(0.95, ge=0, le=1)  # exit if the trial confidence exceeds this
    exit_text: str = "\n</think>\n\n"  # appended on exit; the model then writes its answer


class DynasorConfig(_Strict):
    """Dynasor-CoT (arXiv 2412.20993): probe every `every` tokens; exit on consistent answers."""

    every: int = Field(32, ge=1)  # think tokens between probes
    window: int = Field(3, ge=2)  # the last `window` probe answers must agree
    probe_text: str = "... Oh, I suddenly got the answer to the whole problem, **Final Answer**\n\n\\boxed{"
    probe_max_tokens: int = Field(20, ge=1)
    hedge_words: list[str] = Field(default_factory=lambda: ["wait", "hold", "but", "okay", "no", "hmm"])


class OracleConfig(_Strict):
    """Oracle exit: probe every paragraph break of the EAGLE-3 trace (greedy forced answers); the
    earliest break after which every forced answer is right is where an ideal exit would stop."""

    close_text: str = "</think>\n\n"
    answer_prompt: str = ""
    probe_max_tokens: int = Field(16, ge=1)


class EvalConfig(_Strict):
    output: str  # folder: part-*.parquet (one row per problem x temperature x method x setting) + summary.json
    limit: int | None = Field(None, ge=1)  # first N problems
    input: InputConfig = Field(default_factory=lambda: InputConfig(kind="toy", split="test", n=100, gold_column="gold"))
    grader: Literal["toy", "numeric", "multiple_choice"] = "toy"
    engine: EngineConfig  # the target (teacher); speculation is added from `draft`
    draft: str  # SpecExit draft folder (vLLM Eagle3 layout with signal rows)
    num_speculative_tokens: int = Field(3, ge=1)
    methods: list[str] = Field(default_factory=lambda: list(METHODS))
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.6])  # first one = the headline table
    seed: int = 0  # per-problem sampling seed = seed + crc32(id), the same for every method
    max_tokens: int = Field(400, ge=1)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # SpecExit: ExitConfig overrides (None: the server defaults = the draft's exit_defaults) ...
    specexit_exit: dict[str, Any] | None = None
    # ... or the JSON `specexit calibrate` writes ({"exit": {...}}); wins over specexit_exit.
    calibrated: str | None = None
    budget_sweep: list[int] = Field(default_factory=lambda: [32, 64, 96, 128])  # static thinking budgets
    accuracy_tolerance: float = Field(0.01, ge=0)  # budget "best setting": fewest think tokens within this of eagle3
    deer: DeerConfig = Field(default_factory=DeerConfig)
    dynasor: DynasorConfig = Field(default_factory=DynasorConfig)
    oracle: OracleConfig = Field(default_factory=OracleConfig)
    signals: bool = True  # per-token draft signals along the EAGLE-3 traces (report plots, calibration replay)
    batch_size: int = Field(16, ge=1)  # problems per engine-actor batch = rows per output part
    concurrency: int = Field(1, ge=1)  # engine actors (each runs its problems sequentially)
    think_start: str = "<think>"
    think_end: str = "</think>"
    split_tokens: list[str] | None = None  # None: every single-token paragraph break
    ray: RayConfig = Field(default_factory=lambda: RayConfig(num_cpus=4))

    @field_validator("methods")
    @classmethod
    def _known(cls, v):
        bad = [m for m in v if m not in METHODS]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; known: {', '.join(METHODS)}")
        if not v:
            raise ValueError("methods must not be empty")
        return v

    @field_validator("temperatures")
    @classmethod
    def _temps(cls, v):
        if not v or any(t < 0 for t in v):
            raise ValueError(f"temperatures must be a non-empty list of numbers >= 0, got {v}")
        return v

    def run_methods(self) -> list[str]:
        """Methods in run order: the oracle needs the EAGLE-3 trace, so eagle3 always runs when it does."""
        ms = list(dict.fromkeys(self.methods))
        if "oracle" in ms and "eagle3" not in ms:
            ms.insert(0, "eagle3")
        return [m for m in METHODS if m in ms]


class CalibrateConfig(_Strict):
    """`specexit calibrate`: replay exit settings over signals computed once per dev trace, pick the
    fewest think tokens with accuracy >= eagle3 - tolerance, confirm it with the real engine."""

    output: str  # the calibrated JSON ({"exit": {...}, "calibration": {...}}) for SPECEXIT_EXIT_CONFIG
    eval: EvalConfig  # the dev split run (its `methods` / `temperatures` are set by the calibrator)
    tolerance: float = Field(0.01, ge=0)  # accuracy (fraction) allowed below eagle3
    methods: list[str] = Field(default_factory=lambda: [
        "confidence", "progress", "remain", "confidence_progress", "confidence_remain", "confidence_progress_remain"])
    confidence_thresholds: list[float] = Field(default_factory=lambda: [0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    progress_thresholds: list[float] = Field(default_factory=lambda: [0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    remaining_thresholds: list[float] = Field(default_factory=lambda: [10, 20, 40, 80, 200])
    alphas: list[float] = Field(default_factory=lambda: [0.1, 0.3, 0.5])
    confirm: bool = True  # run the chosen setting with the real engine on the dev split
    write_draft_defaults: bool = False  # also store it as the draft's config.json specexit.exit_defaults


def _read_yaml(path: str | Path) -> dict:
    d = yaml.safe_load(Path(path).read_text())
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return d


def resolve_eval(cfg: EvalConfig) -> EvalConfig:
    cfg.output = resolve_path(cfg.output)
    cfg.engine.model = resolve_model(cfg.engine.model)
    cfg.draft = resolve_model(cfg.draft)
    if cfg.calibrated:
        cfg.calibrated = resolve_path(cfg.calibrated)
    if cfg.input.path and cfg.input.kind != "hf_hub":
        cfg.input.path = resolve_path(cfg.input.path)
    return cfg


def load_eval_config(path: str | None = None, *, raw: dict | None = None, output: str | None = None,
                     input: str | None = None, limit: int | None = None, calibrated: str | None = None) -> EvalConfig:
    """YAML (or a dict) + command-line overrides -> validated EvalConfig with absolute paths."""
    from pipelines.common.config import infer_input_kind

    d = dict(raw or {}) if path is None else _read_yaml(path)
    if output is not None:
        d["output"] = output
    if limit is not None:
        d["limit"] = limit
    if calibrated is not None:
        d["calibrated"] = calibrated
    if input is not None:
        inp = dict(d.get("input") or {})
        inp.update(path=input, kind=infer_input_kind(input))
        d["input"] = inp
    try:
        cfg = EvalConfig.model_validate(d)
    except ValidationError as e:
        raise ConfigError(f"invalid evaluate config{f' {path}' if path else ''}:\n{e}") from None
    return resolve_eval(cfg)


def load_calibrate_config(path: str | None = None, *, raw: dict | None = None, output: str | None = None,
                          limit: int | None = None) -> CalibrateConfig:
    d = dict(raw or {}) if path is None else _read_yaml(path)
    if output is not None:
        d["output"] = output
    if limit is not None:
        d.setdefault("eval", {})["limit"] = limit
    try:
        cfg = CalibrateConfig.model_validate(d)
    except ValidationError as e:
        raise ConfigError(f"invalid calibrate config{f' {path}' if path else ''}:\n{e}") from None
    cfg.output = resolve_path(cfg.output)
    resolve_eval(cfg.eval)
    return cfg
