"""Typed config of `specexit demo` (`examples/toy/demo.yaml`): which stage configs to run, how
big, and the smaller `quick` variant. Unknown keys are errors, as in every config.

`specexit demo --teacher NAME` picks the recipe of a teacher: `toy` (the default) or a built-in
teacher (the teacher registry's) that has a recipe, `examples/<NAME with - as _>/demo.yaml`
(`qwen3-like`: `examples/qwen3_like/demo.yaml`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from specexit_core.exit.efforts import EXIT_LEVELS
from specexit_core.teachers.model_ref import builtin_teachers
from specexit_core.typed_config import ConfigError, StrictModel, load_config, read_yaml, resolve_path

CHECKOUT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = CHECKOUT / "examples" / "toy" / "demo.yaml"
STAGE_FILES = ("traces", "labels", "train_draft", "calibrate", "serve", "evaluate")
DEFAULT_TEACHER = "toy"


def _recipe(teacher: str) -> Path:
    return CHECKOUT / "examples" / teacher.replace("-", "_") / "demo.yaml"


def demo_teachers() -> tuple[str, ...]:
    """The `--teacher` choices: the toy and every built-in teacher with a demo recipe."""
    return (DEFAULT_TEACHER, *(t for t in builtin_teachers() if _recipe(t).exists()))


def demo_config_path(teacher: str = DEFAULT_TEACHER) -> Path:
    """The demo recipe of `teacher` (`toy` or a built-in teacher); ConfigError naming the choices."""
    choices = demo_teachers()
    if teacher not in choices:
        raise ConfigError(f"unknown teacher {teacher!r} for the demo; choose one of: {', '.join(choices)}")
    return _recipe(teacher)


class QuickOverrides(StrictModel):
    workdir: str | None = None
    problems: int | None = Field(None, ge=2)
    train_steps: int | None = Field(None, ge=1)
    calibrate_problems: int | None = Field(None, ge=1)
    calibrate_confirm: bool | None = None
    calibrate_peers: bool | None = None
    serve_requests: int | None = Field(None, ge=1)
    eval_problems: int | None = Field(None, ge=1)
    eval_latency_problems: int | None = Field(None, ge=1)
    eval_budget_sweep: list[int] | None = None
    eval_concurrency: int | None = Field(None, ge=1)
    calibrate_samples: int | None = Field(None, ge=1)
    calibrate_selection: Literal["tolerance", "certified"] | None = None
    eval_samples: int | None = Field(None, ge=1)
    eval_efforts: list[str] | None = None
    temperatures: list[float] | None = None


class DemoConfig(StrictModel):
    teacher: str = DEFAULT_TEACHER  # the teacher's name: in the summary, so a result names its model
    workdir: str = "runs/demo"
    traces: str
    labels: str
    train_draft: str
    calibrate: str
    serve: str
    evaluate: str
    problems: int = Field(256, ge=2)
    init_draft: Literal["stock", "scratch"] = "stock"
    train_steps: int = Field(150, ge=1)
    calibrate_problems: int = Field(60, ge=1)
    # run the chosen settings on the dev split once more before going on (the evaluation stage runs
    # them on the test split in any case)
    calibrate_confirm: bool = False
    # choose DEER / Dynasor / the budget on the dev split too (None: the calibrate recipe's `peers`);
    # not chosen, the evaluation runs them at its recipe's settings
    calibrate_peers: bool | None = None
    # which rule makes the exit's final choice (None: the calibrate recipe's `selection`): `certified`
    # (Learn then Test) needs a dev split of hundreds of problems; a quick run's few check the mechanics
    calibrate_selection: Literal["tolerance", "certified"] | None = None
    serve_requests: int = Field(8, ge=1)
    eval_problems: int = Field(100, ge=1)
    # problems timed one request at a time (None: the evaluate recipe's `latency_problems`)
    eval_latency_problems: int | None = Field(None, ge=1)
    # the static thinking budgets the evaluation sweeps (None: the evaluate recipe's `budget_sweep`); a
    # budget chosen on the dev split (calibrate_peers) is added to it
    eval_budget_sweep: list[int] | None = None
    # engine actors of the evaluation and of the calibration's dev run (None: the evaluate recipe's
    # `concurrency`); each starts its engines, so a run of a few problems is quicker on one
    eval_concurrency: int | None = Field(None, ge=1)
    # samples per problem at each sampled temperature (greedy: one): in the calibration's dev run (the
    # certificate takes a prompt's mean loss over its samples) and in the evaluation, where they run
    # eagle3, specexit and the oracle (the peers stay at one sample per problem: demo.EVAL_SAMPLE_METHODS)
    calibrate_samples: int = Field(1, ge=1)
    eval_samples: int = Field(1, ge=1)
    # with eval_samples > 1, the peers run on the first this many evaluation problems only (None: all):
    # the comparison of eagle3, specexit and the oracle gets every problem, the peers a table's worth
    eval_peer_problems: int | None = Field(None, ge=1)
    # the reasoning effort levels the evaluation runs SpecExit at ([]: none; `by_effort` in demo.json)
    eval_efforts: list[str] = Field(default_factory=lambda: list(EXIT_LEVELS))
    # the evaluation's temperatures, and so the calibration's (the exit must hold at each; 0.0 first)
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.6])
    serve_port: int = Field(8000, ge=1, le=65535)
    quick: QuickOverrides = Field(default_factory=QuickOverrides)

    @field_validator("eval_budget_sweep")
    @classmethod
    def _budgets(cls, v):
        if v is not None and (not v or any(b < 1 for b in v)):
            raise ValueError(f"eval_budget_sweep must be a non-empty list of think-token budgets >= 1, got {v}")
        return v

    @field_validator("temperatures")
    @classmethod
    def _calibratable(cls, v):  # checked before the first stage, not at the fourth
        from pipelines.calibrate.config import check_temperatures

        return check_temperatures(v)

    def resolve_paths(self) -> DemoConfig:
        for name in STAGE_FILES:  # stage configs are files of the checkout: resolve them there
            p = Path(getattr(self, name))
            setattr(self, name, str(p if p.is_absolute() else CHECKOUT / p))
        self.workdir = resolve_path(self.workdir)
        return self


def load_demo_config(
    path: str | Path | None = None,
    *,
    quick: bool = False,
    workdir: str | None = None,
    port: int | None = None,
    teacher: str | None = None,
) -> DemoConfig:
    """The demo recipe: `path`, else the recipe of `teacher` (`demo_config_path`; None: the toy's);
    `quick`: its `quick` block replaces the fields it sets; then the command line's `--workdir` /
    `--port`. Raises ConfigError."""
    path = Path(path or demo_config_path(teacher or DEFAULT_TEACHER))
    raw = read_yaml(path)
    block = raw.get("quick") if quick else None
    overrides = dict(block) if isinstance(block, dict) else {}  # a malformed block: validation names it
    overrides.update({k: v for k, v in (("workdir", workdir), ("serve_port", port)) if v})
    return load_config(DemoConfig, path, raw=raw, overrides=overrides, what="demo")
