"""The threshold check at a paragraph break: do the selected smoothed signals pass?"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from specexit_core.exit.settings import ExitConfig

# Strict comparisons: a signal exactly at its threshold does not pass.
_PASSES: dict[str, Callable[[float, ExitConfig], bool]] = {
    "confidence": lambda v, cfg: v > cfg.confidence_threshold,
    "progress": lambda v, cfg: v > cfg.progress_threshold,
    "remaining": lambda v, cfg: v < cfg.remaining_threshold,
}


def passes(smoothed: Mapping[str, float], cfg: ExitConfig) -> bool:
    """True when every signal `cfg.method` selects is past its threshold: confidence and progress
    above theirs, remaining below its. The one check, used by `ExitTracker` (so by every engine)
    and by calibration's replay."""
    return all(_PASSES[name](smoothed[name], cfg) for name in cfg.signals_used)


def signal_passes(name: str, value, thresholds):
    """One signal's comparison with its threshold, elementwise when `value` and the thresholds are
    arrays (the batch tracker's per-request settings): the same rule as `passes`."""
    return _PASSES[name](value, thresholds)
