"""The drafter's dynamic partial KV cache (TokenSwift's retrieval cache).

The draft forward is the full target model, but its attention reads a bounded cache instead of the whole
context: per layer and KV head, the first `sinks` positions (attention sinks) plus the `budget - sinks -
room` older positions with the highest query-key score, where the score of a position is the last query's
q.k summed over the query heads of that KV head's GQA group. Tokens committed afterwards are appended (their
K, V copied from the full cache the verification wrote); once `room` of them have been appended the budget is
full and the next draft forward reselects from the full KV, using its own last query. Verification always
uses the full KV, so the cache changes what is *proposed*, never what is *accepted*.

While the whole context fits in the budget the selection is the identity (the draft forward then equals the
target's, so the base draft token is the target's own greedy token).
"""

from __future__ import annotations

import torch
from pydantic import model_validator

from specexit_core.typed_config import StrictModel


class PartialKVConfig(StrictModel):
    budget: int = 4096  # positions the drafter attends to per layer and KV head (TokenSwift: 4096)
    sinks: int = 16  # first positions always kept
    room: int = 256  # appended positions after a selection before it is rerun

    @model_validator(mode="after")
    def _fits(self):
        if self.sinks < 0 or self.room < 1 or self.sinks + self.room >= self.budget:
            raise ValueError(
                f"need sinks >= 0, room >= 1, sinks + room < budget, got {self.sinks}, {self.room}, {self.budget}"
            )
        return self


class PartialKV:
    """Per layer: gathered K, V [kv_heads, n, d] of the selected positions, then the appended ones."""

    def __init__(self, cfg: PartialKVConfig, n_layers: int):
        self.cfg = cfg
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.covered = 0  # full-cache positions [0, covered) are represented (selected or appended)
        self.appended = 0
        self.stale = True  # reselect at the next draft forward
        self.selections = 0  # how many times the selection ran (for the stats)
        self.window_read = 0  # a sliding-window target's drafts read its window instead (Target.forward)

    def layer(self, i: int, q: torch.Tensor, full) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V the draft forward's layer i attends to (before its own new tokens); q [heads, T, d] are
        that layer's queries of the new tokens (the last one scores positions when reselecting)."""
        if self.stale:
            k, v = full.layer(i)
            self.k[i], self.v[i] = self._select(k, v, q[:, -1])
            if i == len(self.k) - 1:
                self.stale, self.covered, self.appended = False, full.length, 0
                self.selections += 1
        return self.k[i], self.v[i]

    def _select(self, k: torch.Tensor, v: torch.Tensor, q_last: torch.Tensor):
        n = k.shape[1]
        keep = self.cfg.budget - self.cfg.room
        if n <= keep:
            return k.clone(), v.clone()
        kv_heads = k.shape[0]
        group = q_last.shape[0] // kv_heads
        s = self.cfg.sinks
        # score[h, j] = sum over the GQA group of q . k_j  (softmax is monotone per query; TokenSwift sums raw scores)
        qg = q_last.view(kv_heads, group, -1)  # [kv, group, d]
        score = torch.einsum("hgd,hnd->hn", qg, k[:, s:])  # [kv, n - s]
        top = score.topk(keep - s, dim=1).indices.sort(dim=1).values + s  # keep positional order
        idx = torch.cat([torch.arange(s, device=k.device).expand(kv_heads, s), top], 1)  # [kv, keep]
        gather = idx[..., None].expand(-1, -1, k.shape[2])
        return k.gather(1, gather), v.gather(1, gather)

    def append_from(self, full) -> None:
        """Append the full cache's positions [covered, full.length) (just committed by a verification)."""
        if self.stale:
            return
        new = full.length - self.covered
        if new <= 0:
            return
        for i in range(len(self.k)):
            fk, fv = full.layer(i)
            self.k[i] = torch.cat([self.k[i], fk[:, self.covered : full.length]], 1)
            self.v[i] = torch.cat([self.v[i], fv[:, self.covered : full.length]], 1)
        self.covered = full.length
        self.appended += new
        if self.appended >= self.cfg.room:
            self.stale = True

    def note_window(self, n: int) -> None:
        """A sliding-window target's draft read the `n` cached positions of its window instead of this cache."""
        self.window_read = max(self.window_read, n)

    @property
    def size(self) -> int:
        """Positions per layer and KV head the drafter attends to (its KV footprint)."""
        if self.window_read:
            return self.window_read
        return 0 if self.k[0] is None else self.k[0].shape[1]
