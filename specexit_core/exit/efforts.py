"""Reasoning effort levels: `reasoning_effort` as certified exit operating points.

vLLM's chat API accepts `reasoning_effort` in none | minimal | low | medium | high | xhigh | max, and
on its own only turns thinking off for `none`. Here each level between is an exit certified at its
own accuracy cost: `specexit calibrate` runs Learn then Test once per level at the level's epsilon
(`DEFAULT_EPSILONS`, fractions like the certified exit's) on the same replayed dev traces, and the
calibrated file gains

    "efforts": {"low": {"epsilon": 0.05, "exit": {...}, "by_profile": {...}}, ...}

each level shaped like the file itself (a joint exit, one per sampling profile). A request's level
picks its exit (`serving_level`): its own where the server has it, else the nearest more
conservative level it has (a level asks for at most its epsilon of loss, so a lower one is always
allowed), and `max`, or a level above every calibrated one, runs with no early exit. `none` leaves
the exit as it is: thinking is off in the prompt (the chat template's `enable_thinking: false`), or,
where the template has no such switch (R1-style), the vLLM hook makes `</think>` the first generated
token (`runner_hook._force_close_first`).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

# vLLM 0.32's values (`entrypoints/openai/chat_completion/protocol.py`), least thinking first
EFFORTS: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# the levels that are certified exits, and each one's epsilon (the accuracy loss it may cost)
DEFAULT_EPSILONS = MappingProxyType({"minimal": 0.10, "low": 0.05, "medium": 0.02, "high": 0.01, "xhigh": 0.005})
NO_EARLY_EXIT = "max"
THINKING_OFF = "none"
# the levels SpecExit runs at (every one but `none`, which is the NoThinking baseline)
EXIT_LEVELS: tuple[str, ...] = EFFORTS[1:]
# the request control that carries a level (`vllm_xargs`); the Serve endpoint sets it from `reasoning_effort`
EFFORT_CONTROL = "specexit_effort"
# the deployment's level for a request that names none (Serve: `specexit.default_effort` sets it)
DEFAULT_EFFORT_ENV = "SPECEXIT_DEFAULT_EFFORT"


def parse_effort(value: object) -> str:
    """A valid level (case-insensitive); ValueError naming the choices."""
    if isinstance(value, str) and value.strip().lower() in EFFORTS:
        return value.strip().lower()
    raise ValueError(f"reasoning effort must be one of {', '.join(EFFORTS)}; got {value!r}")


def check_epsilons(epsilons: dict[str, float]) -> dict[str, float]:
    """A calibration's levels: known certified levels, each epsilon in (0, 1), more effort never
    allowed more loss. ValueError otherwise."""
    bad = [k for k in epsilons if k not in DEFAULT_EPSILONS]
    if bad:
        raise ValueError(f"efforts {bad}: the certified levels are {', '.join(DEFAULT_EPSILONS)}")
    ordered = [epsilons[k] for k in EFFORTS if k in epsilons]
    if any(not (0 < e < 1) for e in ordered):
        raise ValueError(f"every effort's epsilon must lie in (0, 1), got {epsilons}")
    if any(a < b for a, b in zip(ordered, ordered[1:])):
        raise ValueError(f"a higher effort must not allow more loss than a lower one, got {epsilons}")
    return dict(epsilons)


def serving_level(level: str, available: Iterable[str]) -> str | None:
    """Which calibrated level serves a request at `level`: the level itself, else the nearest more
    conservative one `available`; NO_EARLY_EXIT (`max`, or above every calibrated level); None for
    `none` (thinking off: the exit's setting does not matter)."""
    level = parse_effort(level)
    if level == THINKING_OFF:
        return None
    have = set(available) | {NO_EARLY_EXIT}  # `max` ends EFFORTS: every level finds one
    return next(c for c in EFFORTS[EFFORTS.index(level) :] if c in have)
