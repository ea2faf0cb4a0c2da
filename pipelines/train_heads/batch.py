"""One training step's data: the teacher's sequences from a batch of trace rows, and the positions
the heads learn at. Pure functions (the worker loop and the unit tests call them)."""

from __future__ import annotations

import torch

from specexit_core.longgen.train_heads import IGNORE


def sequences(prompts, completions, max_len: int | None) -> list[list[int]]:
    """prompt + completion token ids per row (what the target saw and wrote), cut to `max_len`."""
    out = []
    for p, c in zip(prompts, completions):
        seq = [int(t) for t in p] + [int(t) for t in c]
        out.append(seq[:max_len] if max_len else seq)
    return out


def pick_positions(labels: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """Up to `n` distinct positions that have a label for the first head (labels [num_heads, N]; the
    last two positions of each sequence have none), drawn at random."""
    valid = (labels[0] != IGNORE).nonzero().flatten()
    if valid.numel() <= n:
        return valid
    return valid[torch.randperm(valid.numel(), generator=generator)[:n]].sort().values
