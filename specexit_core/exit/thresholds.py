"""The threshold check at a paragraph break: do the selected smoothed signals pass?"""

from __future__ import annotations

from collections.abc import Mapping

from specexit_core.exit.settings import ExitConfig

# The one home of the rule: which side of its threshold a signal passes on, strictly (a signal
# exactly at its threshold does not pass): +1 above (confidence, progress), -1 below (remaining).
# `side * v > side * t` is `v > t` or `v < t` bit for bit (negation is exact, NaN fails either way),
# and the batch tracker compares whole arrays in that one form.
PASS_SIDE: dict[str, float] = {"confidence": 1.0, "progress": 1.0, "remaining": -1.0}


def passes(smoothed: Mapping[str, float], cfg: ExitConfig) -> bool:
    """True when every signal `cfg.method` selects is past its threshold: confidence and progress
    above theirs, remaining below its. The one check, used by `ExitTracker` (so by every engine)
    and by calibration's replay."""
    return all(signal_passes(name, smoothed[name], cfg) for name in cfg.signals_used)


def signal_passes(name: str, value, thresholds):
    """One signal's comparison with its threshold (`thresholds.<name>_threshold`), elementwise when
    `value` and the thresholds are arrays: the same rule as `passes`."""
    side = PASS_SIDE[name]
    return side * value > side * getattr(thresholds, f"{name}_threshold")
