"""The names of the three SpecExit signals and the method strings that select among them.

The one home of the names: the draft's `fc` signal rows (`specexit_core.signals`), the vLLM
plugin and the exit settings all use this order.
"""

from __future__ import annotations

from functools import lru_cache

SIGNALS: tuple[str, ...] = ("confidence", "progress", "remaining")

# Names accepted in `ExitConfig.method`; "remain" is the paper's spelling.
_METHOD_NAMES = {**{s: s for s in SIGNALS}, "remain": "remaining"}
_METHOD_HELP = "confidence, progress, remain (alias: remaining)"


def parse_method(method: str) -> tuple[str, ...]:
    """'progress_confidence' -> ('confidence', 'progress') (canonical order)."""
    if not isinstance(method, str) or not method:
        raise ValueError(
            f"method must be a non-empty string of signal names joined by '_' (allowed: {_METHOD_HELP}), got {method!r}"
        )
    return _parse(method)


@lru_cache(maxsize=256)  # the exit check asks at every paragraph break (ExitConfig.signals_used)
def _parse(method: str) -> tuple[str, ...]:
    picked: set[str] = set()
    for part in method.split("_"):
        if part not in _METHOD_NAMES:
            raise ValueError(f"method {method!r}: unknown signal {part!r} (allowed: {_METHOD_HELP})")
        if _METHOD_NAMES[part] in picked:
            raise ValueError(f"method {method!r}: signal {part!r} is listed twice")
        picked.add(_METHOD_NAMES[part])
    return tuple(s for s in SIGNALS if s in picked)
