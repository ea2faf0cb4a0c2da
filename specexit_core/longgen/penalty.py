"""The contextual penalty: a repetition penalty (theta) over the last W tokens only.

It is part of the *target distribution*: plain decoding (`plain.plain_decode`) and the engine's draft and
verification logits all go through `penalise`, so "lossless" means lossless w.r.t. the penalised target.
The formula is the usual repetition penalty (CTRL / HF): a penalised token's logit is divided by theta when
positive and multiplied by theta when negative; each token counts once, however often it occurs in the window.
"""

from __future__ import annotations

import torch
from pydantic import Field

from specexit_core.typed_config import StrictModel


class PenaltyConfig(StrictModel):
    theta: float = Field(1.2, gt=0, le=100)  # TokenSwift's value; 1.0 disables the penalty
    window: int = Field(1024, ge=0)  # W: only the last W tokens of the sequence (prompt included) are penalised

    @property
    def enabled(self) -> bool:
        return self.theta != 1.0 and self.window > 0


def penalise(logits: torch.Tensor, present: torch.Tensor, theta: float) -> torch.Tensor:
    """logits [..., V]; present [..., V] bool: the tokens of each row's window."""
    if theta == 1.0:
        return logits
    scaled = torch.where(logits > 0, logits / theta, logits * theta)
    return torch.where(present, scaled, logits)


def window_presence(tokens: list[int], vocab: int, window: int, device=None) -> torch.Tensor:
    """[V] bool: tokens among the last `window` of `tokens`."""
    present = torch.zeros(vocab, dtype=torch.bool, device=device)
    if window > 0 and tokens:  # (window_presence(seq, V, 0) is the empty window)
        present[torch.tensor(tokens[-window:], dtype=torch.long, device=device)] = True
    return present


def tree_presence(seq: list[int], paths: list[list[int]], vocab: int, window: int, device=None) -> torch.Tensor:
    """[N, V] bool: the window of each tree node, whose context is `seq + paths[n]` (paths[n] = the node's
    ancestors' tokens and its own, root excluded: the node row predicts the token after them)."""
    by_depth: dict[int, torch.Tensor] = {}
    for path in paths:  # the part of the window still inside seq shrinks as the node gets deeper
        d = len(path)
        if d not in by_depth:
            by_depth[d] = window_presence(seq, vocab, max(window - d, 0), device)
    out = torch.stack([by_depth[len(path)] for path in paths])
    rows, cols = [], []
    for n, path in enumerate(paths):
        tail = path[-window:] if window > 0 else []
        rows.extend([n] * len(tail))
        cols.extend(tail)
    if rows:
        out[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = True
    return out


def chain_presence(seq: list[int], drafts: list[int], vocab: int, window: int, device=None) -> torch.Tensor:
    """[len(drafts) + 1, V] bool: the windows of a speculative step's verification rows. Row j predicts the
    token after `seq + drafts[:j]` (a chain is a tree whose node j's path is drafts[:j]), so it is
    `tree_presence` with those paths: what plain decoding would penalise at that point."""
    return tree_presence(seq, [list(drafts[:j]) for j in range(len(drafts) + 1)], vocab, window, device)
