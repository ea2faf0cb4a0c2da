"""Typed config of `specexit calibrate` (a documented recipe; unknown keys are errors): the
exit-setting grid, and the `EvalConfig` of the dev-split run it replays and confirms."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipelines.calibrate.certificate import LOSSES, LossName
from pipelines.evaluate.config import EvalConfig
from specexit_core.exit.efforts import DEFAULT_EPSILONS, check_epsilons
from specexit_core.typed_config import StrictModel, read_yaml, resolve_path


def _find_recipe(p: str) -> Path:
    """The recipe as given (absolute, or against the config base dir), else in this checkout."""
    for cand in (Path(resolve_path(p)), Path(__file__).resolve().parents[2] / p):
        if cand.exists():
            return cand
    raise ValueError(f"eval_recipe {p!r} not found")


class CalibrateConfig(StrictModel):
    """`specexit calibrate`: replay exit settings over signals computed once per dev trace, pick the
    fewest think tokens with accuracy >= eagle3 - tolerance (or the certified setting: `selection`),
    confirm it with the real engine."""

    output: str  # the calibrated JSON ({"exit": {...}, "calibration": {...}}) for SPECEXIT_EXIT_CONFIG
    # An evaluation recipe (EvalConfig YAML) whose keys fill what `eval` leaves out: the engine, the
    # draft and the peers' probe texts then have one home (the evaluation's); `eval`'s keys win.
    eval_recipe: str | None = None
    eval: EvalConfig  # the dev split run (its `methods` / `temperatures` are set by the calibrator)
    tolerance: float = Field(0.01, ge=0)  # accuracy (fraction) allowed below eagle3
    # The certified exit (Learn then Test, pipelines/calibrate/certificate.py): the settings whose loss
    # on new prompts is <= epsilon with probability >= 1 - delta, ordered on `order_share` of the dev
    # prompts (drawn with `seed`) and tested on the rest. Always computed and recorded
    # (`calibration.certificate`); `selection: certified` makes it the choice (none certified: exit
    # off), `tolerance` keeps the point-estimate rule above. epsilon is a fraction, like `tolerance`.
    selection: Literal["tolerance", "certified"] = "tolerance"
    epsilon: float = Field(0.01, gt=0, lt=1)
    delta: float = Field(0.1, gt=0, lt=1)
    # per prompt: `disagreement` (no gold needed): the answer forced at the exit differs from the one the
    # trace reaches at its natural end; `accuracy_drop` (needs gold): right at the natural end, wrong at the exit
    loss: LossName = LOSSES[0]
    order_share: float = Field(0.5, gt=0, lt=1)
    seed: int = 0
    # The exit must hold at each of these (accuracy >= eagle3's - tolerance on the dev split): greedy
    # first (the headline replay; the peers are replayed on the greedy traces), then e.g. the serving
    # temperature, replayed on sampled EAGLE-3 traces with the evaluation's per-problem seeds.
    temperatures: list[float] = Field(default_factory=lambda: [0.0])
    methods: list[str] = Field(
        default_factory=lambda: [
            "confidence",
            "progress",
            "remain",
            "confidence_progress",
            "confidence_remain",
            "confidence_progress_remain",
        ]
    )
    # wide enough that the toy's choice lies inside every axis; a choice at an end is reported
    # (`calibration.at_grid_edge`), since a better setting may then lie beyond the grid
    confidence_thresholds: list[float] = Field(
        default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]
    )
    progress_thresholds: list[float] = Field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.9])
    remaining_thresholds: list[float] = Field(default_factory=lambda: [5, 10, 20, 40, 80, 200, 1000])
    # 0.03: the toy's certified choice sat at 0.05, the lowest value; with 0.01-0.03 added it stays there,
    # the same setting and bound (docs/results/certificate_coverage/alpha_edge_toy_cpu.json)
    alphas: list[float] = Field(default_factory=lambda: [0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0])
    # The peers, chosen on the same dev traces by the same rule (pipelines/calibrate/peers.py); the
    # chosen settings go into the output's "peers", which the evaluation uses (`calibrated:`).
    # reasoning effort levels (specexit_core/exit/efforts.py): each certified at its own epsilon over the
    # same replay, written as the calibrated file's `efforts` ({} or null: none)
    efforts: dict[str, float] | None = Field(default_factory=lambda: dict(DEFAULT_EPSILONS))
    peers: bool = True
    peer_problems: int | None = Field(None, ge=1)  # the peers are chosen on the first N dev problems (None: all)
    deer_thresholds: list[float] = Field(
        default_factory=lambda: [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999]
    )
    deer_means: list[Literal["arithmetic", "geometric"]] = Field(default_factory=lambda: ["arithmetic", "geometric"])
    dynasor_every: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32])  # probe interval (tokens)
    dynasor_windows: list[int] = Field(default_factory=lambda: [2, 3, 4, 5, 6, 8])  # answers that must agree
    budgets: list[int] = Field(default_factory=lambda: [8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 256])
    confirm: bool = True  # run the chosen setting with the real engine on the dev split
    write_draft_defaults: bool = False  # also store it as the draft's config.json specexit.exit_defaults

    @model_validator(mode="before")
    @classmethod
    def _fill_from_recipe(cls, data: Any):
        if isinstance(data, dict) and data.get("eval_recipe") and isinstance(data.get("eval") or {}, dict):
            recipe = read_yaml(_find_recipe(str(data["eval_recipe"])))
            data = {**data, "eval": {**recipe, **(data.get("eval") or {})}}
        return data

    @field_validator("efforts")
    @classmethod
    def _efforts(cls, v):
        return None if v is None else check_epsilons(v)

    @field_validator("temperatures")
    @classmethod
    def _greedy_first(cls, v):
        return check_temperatures(v)

    @field_validator("deer_thresholds", "dynasor_every", "dynasor_windows", "budgets")
    @classmethod
    def _non_empty_positive(cls, v):
        if not v or any(x <= 0 for x in v):
            raise ValueError(f"must be a non-empty list of positive numbers, got {v}")
        return v

    @field_validator("dynasor_windows")
    @classmethod
    def _windows(cls, v):
        if any(w < 2 for w in v):
            raise ValueError(f"Dynasor windows must be >= 2 (answers that agree), got {v}")
        return v

    def probe_stride(self) -> int:
        """Dynasor candidates are probed every gcd(intervals) think tokens: every interval is replayable."""
        return math.gcd(*self.dynasor_every)

    def resolve_paths(self) -> CalibrateConfig:
        self.output = resolve_path(self.output)
        self.eval.resolve_paths()
        return self


def check_temperatures(v: list[float]) -> list[float]:
    """Calibration's temperatures: greedy first (its traces carry the headline replay and the peers'
    probes), then any sampling temperatures, distinct and >= 0. ValueError otherwise."""
    if not v or v[0] != 0.0 or any(t < 0 for t in v) or len(set(v)) != len(v):
        raise ValueError(f"temperatures must start with 0.0 and be distinct and >= 0, got {v}")
    return v


def load_calibrate_config(
    config: str,
    *,
    output: str | None = None,
    limit: int | None = None,
    prompts: str | None = None,
    prompt_column: str | None = None,
    samples: int | None = None,
    temperatures: list[float] | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
) -> CalibrateConfig:
    """`specexit calibrate`'s config: the recipe with the command line's overrides. `prompts` (a JSONL
    or Parquet file of the user's own prompts, no answers): the dev run reads them instead of the
    recipe's input, grades every answer against the one its EAGLE-3 trace reaches at its natural end
    (`grade_against: natural_end`), and the exit is the certified one under the gold-free disagreement
    loss; its traces go beside the calibrated file (`<output>-dev/`), so each file keeps its own.
    The sampling the deployment serves with: `temperatures` (greedy first), `top_p`, `top_k` (one
    profile per temperature) and `samples` per prompt at each sampled one (the certificate takes a
    prompt's mean loss over its samples). None: the recipe's.
    ConfigError on a bad recipe, a missing file or one whose kind cannot be told."""
    from pipelines.common.prompt_source import infer_input_kind
    from specexit_core.typed_config import ConfigError, load_config

    over: dict[str, Any] = {
        "output": output,
        "eval.limit": limit,
        "eval.samples": samples,
        "temperatures": temperatures,
        "eval.top_p": top_p,
        "eval.top_k": top_k,
    }
    if prompts is not None:
        path = Path(prompts).expanduser().resolve()
        if not path.exists():
            raise ConfigError(f"--prompts {prompts}: no such file or folder")
        over.update(
            {
                "eval.input": {
                    "kind": infer_input_kind(str(path)),
                    "path": str(path),
                    "prompt_column": prompt_column or "prompt",
                    "gold_column": None,
                },
                "eval.grade_against": "natural_end",
                "selection": "certified",
                "loss": "disagreement",
            }
        )
    elif prompt_column is not None:
        raise ConfigError("--prompt-column goes with --prompts FILE")
    cfg = load_config(CalibrateConfig, config, overrides=over, what="calibrate")
    if prompts is not None:
        cfg.eval.output = str(Path(cfg.output).with_suffix("")) + "-dev"
    return cfg
