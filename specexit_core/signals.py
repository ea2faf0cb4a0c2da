"""The three SpecExit signals and how the draft's raw `fc` rows become them.

The draft's fusion layer `fc` has H + 3 output rows; the last three are raw signals, activated as
sigmoid (confidence), sigmoid (progress) and exp-1 (remaining think tokens, regressed as log1p).
"""

from __future__ import annotations

import math

import torch

from specexit_core.exit.signal_names import SIGNALS

# per signal, in SIGNALS order (= the order of the fc rows); written into the draft's config.json
ACTIVATIONS: dict[str, str] = dict(zip(SIGNALS, ("sigmoid", "sigmoid", "expm1")))
REMAINING_RAW_MAX = 20.0  # log1p of the remaining think tokens is clamped here before expm1


def activate(raw: torch.Tensor) -> torch.Tensor:
    """[..., 3] raw fc rows -> [..., 3] (confidence in 0..1, progress in 0..1, remaining tokens >= 0)."""
    conf = torch.sigmoid(raw[..., 0])
    prog = torch.sigmoid(raw[..., 1])
    rem = torch.expm1(raw[..., 2].clamp(max=REMAINING_RAW_MAX)).clamp(min=0.0)
    return torch.stack([conf, prog, rem], dim=-1)


def activate_value(i: int, v: float) -> float:
    """`activate` of one raw value of signal `i` (the vLLM hook compiles it into its per-row loop).
    The same functions; libm's exp/expm1 instead of torch's vectorised ones may differ in the last
    place (tests/unit/test_signals.py bounds it). NaN stays NaN, as in torch: the hook's finite check
    must see it."""
    if i < 2:
        return 1.0 / (1.0 + math.exp(-v))
    if v > REMAINING_RAW_MAX:
        v = REMAINING_RAW_MAX
    r = math.expm1(v)
    if r < 0.0:
        r = 0.0
    return r
