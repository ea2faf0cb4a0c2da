"""Typed config of `specexit calibrate` (a documented recipe; unknown keys are errors): the
exit-setting grid, and the `EvalConfig` of the dev-split run it replays and confirms."""

from __future__ import annotations

from pydantic import Field

from pipelines.evaluate.config import EvalConfig
from specexit_core.typed_config import StrictModel, resolve_path


class CalibrateConfig(StrictModel):
    """`specexit calibrate`: replay exit settings over signals computed once per dev trace, pick the
    fewest think tokens with accuracy >= eagle3 - tolerance, confirm it with the real engine."""

    output: str  # the calibrated JSON ({"exit": {...}, "calibration": {...}}) for SPECEXIT_EXIT_CONFIG
    eval: EvalConfig  # the dev split run (its `methods` / `temperatures` are set by the calibrator)
    tolerance: float = Field(0.01, ge=0)  # accuracy (fraction) allowed below eagle3
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
    alphas: list[float] = Field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0])
    confirm: bool = True  # run the chosen setting with the real engine on the dev split
    write_draft_defaults: bool = False  # also store it as the draft's config.json specexit.exit_defaults

    def resolve_paths(self) -> CalibrateConfig:
        self.output = resolve_path(self.output)
        self.eval.resolve_paths()
        return self
