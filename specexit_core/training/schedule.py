"""The drafts' learning-rate schedule: linear warm-up, then cosine to 0 over the run (one home for the Ray Train
stage, the toy's in-process build and the long writer's draft)."""

from __future__ import annotations

import math


def warmup_cosine(lr: float, step: int, steps: int, warmup_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based) of `steps`."""
    return lr * min(1.0, (step + 1) / warmup_steps) * 0.5 * (1 + math.cos(math.pi * step / steps))
