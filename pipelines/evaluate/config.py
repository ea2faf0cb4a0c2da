"""Typed config of the evaluation job (a documented recipe; unknown keys are errors).

`EvalConfig` is what `python -m pipelines.evaluate --config FILE` reads (through
`specexit_core.typed_config.load_config`) and what `pipelines.evaluate.job.run_evaluation(cfg)`
takes; `pipelines.calibrate.config.CalibrateConfig` wraps one for `specexit calibrate`. The peer-method knobs follow `notes/specexit-method.md`; the toy values
(`examples/toy/evaluate.yaml`) replace the real-model probe text (`**Final Answer** \\boxed{`)
with what the toy tokenizer can say (`</think>` + "The answer is").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from pipelines.common.config import EngineConfig, RayConfig
from pipelines.common.methods import METHODS
from pipelines.common.prompt_source import InputConfig
from specexit_core.exit.efforts import EXIT_LEVELS
from specexit_core.teachers.model_ref import resolve_model
from specexit_core.typed_config import StrictModel, resolve_path

# One request per problem: their accuracy runs can go as one batched generate per method (see
# `EvalConfig.latency_problems`); deer / dynasor / oracle are loops of requests per problem.
SINGLE_REQUEST = ("plain", "eagle3", "specexit", "specexit_paper", "specexit_default", "effort", "budget", "nothink")
# Methods with one row per setting (`setting`): the static budgets, the reasoning effort levels.
SWEEPS = ("budget", "effort")


class DeerConfig(StrictModel):
    """DEER (arXiv 2504.15895): at each transition word, a trial answer; exit if it is confident."""

    transition_words: list[str] = Field(default_factory=lambda: ["Wait"])  # single tokens (with/without space)
    probe_text: str = "\n**Final Answer**\n\\boxed"  # appended after the prefix for the trial answer
    trial_max_tokens: int = Field(20, ge=1)
    skip_first: bool = True  # DEER skips the first trial token (the `{` of \boxed{)
    mean: Literal["arithmetic", "geometric"] = "arithmetic"  # R1: arithmetic, Qwen3: geometric
    threshold: float = Field(0.95, ge=0, le=1)  # exit if the trial confidence exceeds this
    exit_text: str = "\n</think>\n\n"  # appended on exit; the model then writes its answer


class DynasorConfig(StrictModel):
    """Dynasor-CoT (arXiv 2412.20993): probe every `every` tokens; exit on consistent answers."""

    every: int = Field(32, ge=1)  # think tokens between probes
    window: int = Field(3, ge=2)  # the last `window` probe answers must agree
    probe_text: str = "... Oh, I suddenly got the answer to the whole problem, **Final Answer**\n\n\\boxed{"
    probe_max_tokens: int = Field(20, ge=1)
    hedge_words: list[str] = Field(default_factory=lambda: ["wait", "hold", "but", "okay", "no", "hmm"])


class OracleConfig(StrictModel):
    """Oracle exit: probe every paragraph break of the EAGLE-3 trace (greedy forced answers); the
    earliest break after which every forced answer is right is where an ideal exit would stop."""

    close_text: str = "</think>\n\n"
    answer_prompt: str = ""
    probe_max_tokens: int = Field(16, ge=1)


class TargetsConfig(StrictModel):
    """What the run is judged against (the `targets` block of the summary): per recipe, since each
    teacher's issue sets its own (the toy: issue #7's; the qwen3-like / r1-llama-like teachers: issue
    #13's). A `None` bound is not checked."""

    think_vs_oracle_max: float = Field(1.25, gt=0)  # SpecExit's think tokens / the oracle's
    think_reduction_vs_eagle3_min: float | None = Field(0.50, ge=0, le=1)  # 1 - SpecExit / EAGLE-3 think tokens
    speedup_vs_eagle3_min: float | None = Field(1.9, gt=0)  # EAGLE-3 latency / SpecExit latency
    accuracy_drop_max_points: float = Field(1.0, ge=0)  # judged on the paired 95% interval


class EvalConfig(StrictModel):
    output: str  # folder: part-*.parquet (one row per problem x temperature x method x setting) + _summary.json (meta_files.py)
    limit: int | None = Field(None, ge=1)  # first N problems
    input: InputConfig = Field(default_factory=lambda: InputConfig(kind="toy", split="test", n=100, gold_column="gold"))
    grader: Literal["toy", "numeric", "multiple_choice"] = "toy"
    # What an answer is graded against: `gold` (the input's gold column; a problem without one is an
    # error row), or `natural_end`: the answer the problem's EAGLE-3 trace at the same temperature
    # reaches at its natural end (no gold needed: `specexit calibrate --prompts FILE`). `correct` then
    # says "agrees with that answer", and the accuracies are agreement rates, whose shortfall from
    # EAGLE-3's is the disagreement loss calibration certifies.
    grade_against: Literal["gold", "natural_end"] = "gold"
    engine: EngineConfig  # the target (teacher); speculation is added from `draft`
    draft: str  # SpecExit draft folder (vLLM Eagle3 layout with signal rows)
    num_speculative_tokens: int = Field(3, ge=1)
    methods: list[str] = Field(default_factory=lambda: [m for m in METHODS if m != "effort"])
    # the reasoning effort levels the `effort` method runs, each at its certified exit (the calibrated
    # file's `efforts`, else the draft's `exit_efforts`; specexit_core/exit/efforts.py's rule for a level
    # neither has): one row per level
    efforts: list[str] = Field(default_factory=lambda: list(EXIT_LEVELS))
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.6])  # first one = the headline table
    # The sampling profile at every sampled temperature (greedy ignores them): nucleus top-p (1: off) and
    # top-k (0: off), e.g. Qwen3's recommended 0.95 / 20. With the temperature they name the profile a
    # calibrated exit is chosen for (`T0.6-p0.95-k20`: specexit_core/exit/profiles.py).
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int = 0  # per-problem sampling seed = seed + crc32(id), the same for every method
    # Samples per problem at every sampled temperature (greedy runs once: it is deterministic). Each
    # sample has its own seed, the same for every method (sample 0's is the seed of a one-sample run);
    # intervals resample problems, each with all its samples, and calibration's certificate takes a
    # prompt's mean loss over them (the samples of one prompt are not independent).
    samples: int = Field(1, ge=1)
    # The methods run on the further samples (None: every method): e.g. [eagle3, specexit, oracle]
    # for a comparison on 1,000 problem-samples while the peers stay at one sample per problem.
    # eagle3 runs wherever the oracle does (it probes eagle3's trace).
    sample_methods: list[str] | None = None
    # ... and the others (the peers) on the first this many problems only (None: every problem): the
    # comparison the certificate is about gets the problems it needs to show a point, the peers keep a
    # table's size (sample 0 of each of these problems runs every method). Needs `sample_methods`.
    peer_problems: int | None = Field(None, ge=1)
    max_tokens: int = Field(400, ge=1)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # SpecExit: ExitConfig overrides (None: the server defaults = the draft's exit_defaults) ...
    specexit_exit: dict[str, Any] | None = None
    # ... or the JSON `specexit calibrate` writes ({"exit": {...}}); wins over specexit_exit.
    calibrated: str | None = None
    budget_sweep: list[int] = Field(default_factory=lambda: [32, 64, 96, 128])  # static thinking budgets
    # The `budget` row of the tables: this sweep setting, chosen on the dev split by `specexit calibrate`
    # (set from the calibrated file's "peers"; added to the sweep if missing). None: the fewest think
    # tokens within `accuracy_tolerance` of eagle3 on this run's own problems (marked "chosen_on": "this run").
    budget_chosen: int | None = Field(None, ge=1)
    # The temperatures at which the whole sweep runs (the report's accuracy-vs-tokens curve); at the
    # others only `budget_chosen` runs, as the `budget` method (the sweep is ~40% of a realistic
    # teacher's evaluation: docs/teachers.md). None: every temperature. Without a chosen budget the sweep
    # runs at every temperature: the `budget` method's setting is then picked from it (`budgets_at`).
    budget_sweep_temperatures: list[float] | None = None
    # At T = 0 the sweep's other points (all but `budget_chosen`) follow the EAGLE-3 greedy trace:
    # "replay" takes each from that trace (its output where it thinks <= b tokens; else its first b
    # think tokens + `</think>` + the greedy answer, one short prefix-cached request), which is what
    # the engine's `max_think_tokens` makes of the same greedy path; "generate" runs each point as
    # a request of its own. Without a chosen budget every point is generated (the method picks one).
    budget_sweep_greedy: Literal["replay", "generate"] = "replay"
    accuracy_tolerance: float = Field(0.01, ge=0)  # budget "best setting": fewest think tokens within this of eagle3
    targets: TargetsConfig = Field(default_factory=TargetsConfig)
    deer: DeerConfig = Field(default_factory=DeerConfig)
    dynasor: DynasorConfig = Field(default_factory=DynasorConfig)
    oracle: OracleConfig = Field(default_factory=OracleConfig)
    signals: bool = True  # per-token draft signals along the EAGLE-3 traces (report plots, calibration replay)
    # calibrate: also probe every greedy EAGLE-3 trace at each DEER / Dynasor / budget exit candidate
    # (oracle rows' info: "deer_points", "dynasor_points", "budget_points" for each of `budget_sweep`),
    # so their settings can be chosen by replay like SpecExit's
    peer_probes: bool = False
    peer_probe_stride: int = Field(1, ge=1)  # Dynasor candidates: every this many think tokens
    # ... on the first this many problems only (None: all): the probes are most of a dev run's time,
    # and the peers' few settings need fewer problems than the certified exit does
    peer_probe_problems: int | None = Field(None, ge=1)
    batch_size: int = Field(16, ge=1)  # problems per engine-actor batch = rows per output part
    # Latency is timed at concurrency 1 (every method, one request at a time, in a shuffled order) on
    # the first `latency_problems` problems; the others get their accuracy and think tokens from one
    # batched generate per single-request method (None: time every problem; 0: none, e.g. calibration's
    # dev run, which only needs each method's tokens).
    latency_problems: int | None = Field(None, ge=0)
    concurrency: int = Field(1, ge=1)  # engine actors (each runs its problems sequentially)
    think_start: str = "<think>"
    think_end: str = "</think>"
    split_tokens: list[str] | None = None  # None: every single-token paragraph break
    ray: RayConfig = Field(default_factory=lambda: RayConfig(num_cpus=4))

    @model_serializer(mode="wrap")
    def _omit_gold_grading(self, handler):
        # Graded against gold, the dump is what it was before `grade_against` existed, so the run
        # identity of evaluations written then still matches and they can be resumed.
        d = handler(self)
        if self.grade_against == "gold":
            d.pop("grade_against", None)
        if self.top_p == 1.0 and self.top_k == 0:  # likewise the sampling profile, off by default
            d.pop("top_p", None)
            d.pop("top_k", None)
        if "effort" not in self.methods:  # and the effort levels, which only the `effort` method reads
            d.pop("efforts", None)
        if self.peer_probe_problems is None:  # and probing every problem's peer candidates
            d.pop("peer_probe_problems", None)
        if self.peer_problems is None:  # and the peers on every problem
            d.pop("peer_problems", None)
        if self.samples == 1 and self.sample_methods is None:  # and one sample per problem
            d.pop("samples", None)
            d.pop("sample_methods", None)
        return d

    @field_validator("methods")
    @classmethod
    def _known(cls, v):
        bad = [m for m in v if m not in METHODS]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; known: {', '.join(METHODS)}")
        if not v:
            raise ValueError("methods must not be empty")
        return v

    @model_validator(mode="after")
    def _sample_methods_run(self):
        if self.sample_methods is not None:
            bad = [m for m in self.sample_methods if m not in self.run_methods()]
            if bad or not self.sample_methods:
                raise ValueError(
                    f"sample_methods {self.sample_methods} must be a non-empty subset of methods {self.methods}"
                )
        if self.peer_problems is not None and self.sample_methods is None:
            raise ValueError("peer_problems needs sample_methods: the methods that run on every problem")
        return self

    @field_validator("efforts")
    @classmethod
    def _levels(cls, v):
        from specexit_core.exit.efforts import THINKING_OFF, parse_effort

        levels = [parse_effort(x) for x in v]
        if THINKING_OFF in levels:
            raise ValueError("efforts: `none` is the nothink method")
        return list(dict.fromkeys(levels))

    @field_validator("temperatures")
    @classmethod
    def _temps(cls, v):
        if not v or any(t < 0 for t in v):
            raise ValueError(f"temperatures must be a non-empty list of numbers >= 0, got {v}")
        return v

    @model_validator(mode="after")
    def _chosen_budget_is_swept(self):
        if self.budget_chosen is not None and self.budget_chosen not in self.budget_sweep:
            raise ValueError(f"budget_chosen {self.budget_chosen} is not in budget_sweep {self.budget_sweep}")
        return self

    @field_validator("budget_sweep_temperatures")
    @classmethod
    def _sweep_temps(cls, v):
        if v is not None and any(t < 0 for t in v):
            raise ValueError(f"budget_sweep_temperatures must be numbers >= 0, got {v}")
        return v

    def budgets_replayed(self, temperature: float) -> list[int]:
        """The sweep points taken from the EAGLE-3 greedy trace at `temperature` (see
        `budget_sweep_greedy`): none but at T = 0, with a chosen budget and the eagle3 method run."""
        if self.budget_sweep_greedy != "replay" or temperature != 0.0 or self.budget_chosen is None:
            return []
        if "eagle3" not in self.methods or "budget" not in self.methods:
            return []
        return [b for b in self.budgets_at(temperature) if b != self.budget_chosen]

    def budgets_at(self, temperature: float) -> list[int]:
        """The static budgets run at `temperature`: the whole sweep, or only the chosen one where
        `budget_sweep_temperatures` leaves the sweep out."""
        sweep_here = self.budget_sweep_temperatures is None or temperature in self.budget_sweep_temperatures
        if sweep_here or self.budget_chosen is None:
            return list(self.budget_sweep)
        return [self.budget_chosen]

    def run_methods(self) -> list[str]:
        """Methods in run order: the oracle needs the EAGLE-3 trace, so eagle3 always runs when it does."""
        ms = list(dict.fromkeys(self.methods))
        if "oracle" in ms and "eagle3" not in ms:
            ms.insert(0, "eagle3")
        return [m for m in METHODS if m in ms]

    def samples_at(self, temperature: float) -> int:
        """How many samples of each problem run at `temperature` (greedy: one)."""
        return self.samples if temperature > 0 else 1

    def methods_for_sample(self, sample: int, peers: bool = True) -> list[str]:
        """The methods run on sample `sample` of a problem, in run order (`run_methods`): all of them on
        sample 0, `sample_methods` (with eagle3 where the oracle runs) on the others, and on every sample
        of a problem past `peer_problems` (`peers` False)."""
        ms = self.run_methods()
        if (sample == 0 and peers) or self.sample_methods is None:
            return ms
        keep = set(self.sample_methods) | ({"eagle3"} if "oracle" in self.sample_methods else set())
        return [m for m in ms if m in keep]

    def sampling_profile(self, temperature: float):
        """How this run samples at `temperature` (greedy is one profile whatever top-p / top-k say)."""
        from specexit_core.exit.profiles import SamplingProfile

        return SamplingProfile.of(temperature, self.top_p, self.top_k)

    def exit_overrides(self, temperature: float | None = None) -> dict[str, Any] | None:
        """The `specexit` request controls at `temperature`: the calibrated file's exit for that
        sampling profile (its `by_profile`; else its joint `exit`) wins over `specexit_exit`; None =
        the server's defaults (which pick by profile themselves)."""
        if self.calibrated:
            from specexit_core.exit.profiles import load_exit_profiles

            profile = None if temperature is None else self.sampling_profile(temperature)
            return load_exit_profiles(Path(self.calibrated)).select(profile)[1]
        return dict(self.specexit_exit) if self.specexit_exit is not None else None

    def effort_exit(self, level: str, temperature: float) -> dict[str, Any]:
        """The exit a request at reasoning effort `level` and `temperature` runs with, in full: the
        draft's `exit_efforts` <- the calibrated file's `efforts` (else $SPECEXIT_EXIT_CONFIG's), by the
        serving rule of specexit_core/exit/efforts.py (a level neither has: the next more conservative
        one; `max`: the signals never fire), for the temperature's sampling profile."""
        import os

        from specexit_core.draft.checkpoint import read_config
        from specexit_core.exit import EXIT_CONFIG_ENV
        from specexit_core.exit.profiles import resolve_exit_defaults

        draft = read_config(self.draft)
        server = self.calibrated or os.environ.get(EXIT_CONFIG_ENV)
        d = resolve_exit_defaults(draft.exit_defaults, draft.exit_profiles, server, draft.exit_efforts)
        return d.for_effort(level)[0].select(self.sampling_profile(temperature))[1].to_dict()

    def with_calibrated_peers(self) -> EvalConfig:
        """A copy whose DEER, Dynasor and budget settings are the ones `specexit calibrate` chose on
        the dev split (the calibrated file's "peers"); unchanged without such a file."""
        if not self.calibrated:
            return self
        import json

        return self.with_peers(json.loads(Path(self.calibrated).read_text()).get("peers"))

    def with_peers(self, peers: dict[str, Any] | None) -> EvalConfig:
        """A copy with a calibrated "peers" block applied: DEER / Dynasor settings, the chosen budget
        (added to the sweep). Validated: an unknown key is an error."""
        if not peers:
            return self
        upd: dict[str, Any] = {}
        if "deer" in peers:
            upd["deer"] = {**self.deer.model_dump(), **peers["deer"]}
        if "dynasor" in peers:
            upd["dynasor"] = {**self.dynasor.model_dump(), **peers["dynasor"]}
        if peers.get("budget") is not None:
            b = int(peers["budget"])
            upd["budget_chosen"] = b
            upd["budget_sweep"] = sorted(set(self.budget_sweep) | {b})
        return type(self).model_validate({**self.model_dump(), **upd})

    def resolve_paths(self) -> EvalConfig:
        self.output = resolve_path(self.output)
        if self.calibrated:
            self.calibrated = resolve_path(self.calibrated)
        self.draft = resolve_model(self.draft)
        self.engine.resolve_paths()
        self.input.resolve_paths()
        return self
