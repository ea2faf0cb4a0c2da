"""The three SpecExit signals and how the draft's raw `fc` rows become them.

The draft's fusion layer `fc` has H + 3 output rows; the last three are raw signals, activated as
sigmoid (confidence), sigmoid (progress) and exp-1 (remaining think tokens, regressed as log1p).
"""

from __future__ import annotations

import torch

from specexit_core.exit.signal_names import SIGNALS

# per signal, in SIGNALS order (= the order of the fc rows); written into the draft's config.json
ACTIVATIONS: dict[str, str] = dict(zip(SIGNALS, ("sigmoid", "sigmoid", "expm1")))


def activate(raw: torch.Tensor) -> torch.Tensor:
    """[..., 3] raw fc rows -> [..., 3] (confidence in 0..1, progress in 0..1, remaining tokens >= 0)."""
    conf = torch.sigmoid(raw[..., 0])
    prog = torch.sigmoid(raw[..., 1])
    rem = torch.expm1(raw[..., 2].clamp(max=20.0)).clamp(min=0.0)
    return torch.stack([conf, prog, rem], dim=-1)
