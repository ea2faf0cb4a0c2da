"""Training and shipping a 152k-vocabulary teacher through the few token ids its text uses.

A built-in teacher writes a few hundred distinct Qwen3 / Llama-3 tokens out of ~150k; a dense
embedding of the whole vocabulary would not fit the shipping budget (issue #13: weights + tokenizer
<= 40 MB). So the model is trained *compact* - embedding rows only for the used ids - and expanded to
the full vocabulary when a checkpoint is needed, with zero rows for every unused id.

Why this is exact, not an approximation: with tied embeddings a zero row gives the logit 0, so in
the dense model every unused id has probability exp(0) / Z. The dense softmax over all ids therefore
equals a softmax over [the used ids' logits, one extra class of logit log(N_unused)]: the extra
class holds exactly the N_unused * exp(0) mass. Training with that extra class trains the dense
model's own full-vocabulary loss, and the expanded checkpoint generates what the compact one scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RestrictedVocab:
    """The used token ids (sorted) of a full vocabulary of `full_size` rows."""

    used_ids: tuple[int, ...]
    full_size: int

    def __post_init__(self) -> None:
        if list(self.used_ids) != sorted(set(self.used_ids)):
            raise ValueError("used_ids must be sorted and distinct")
        if not self.used_ids or self.used_ids[0] < 0 or self.used_ids[-1] >= self.full_size:
            raise ValueError(f"used_ids must lie in 0..{self.full_size - 1}")

    @property
    def n_used(self) -> int:
        return len(self.used_ids)

    @property
    def n_unused(self) -> int:
        return self.full_size - self.n_used

    @property
    def unused_logit(self) -> float:
        """The extra class's logit: the log of the unused ids' total exp(0) mass."""
        return math.log(self.n_unused) if self.n_unused else -math.inf

    def to_compact(self, ids: torch.Tensor) -> torch.Tensor:
        """Full ids -> compact indices (an id outside the used set is an error, not a silent zero)."""
        table = torch.full((self.full_size,), -1, dtype=torch.long)
        table[torch.tensor(self.used_ids)] = torch.arange(self.n_used)
        out = table[ids]
        if bool((out < 0).any()):
            bad = sorted(set(ids[out < 0].tolist()))[:5]
            raise ValueError(f"token ids outside the restricted vocabulary: {bad}")
        return out

    def to_full(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.used_ids)[idx]

    def log_probs(self, compact_logits: torch.Tensor) -> torch.Tensor:
        """Exact full-vocabulary log-probabilities of the used ids (last dim: n_used) plus, as the
        last column, the log of the total probability of all unused ids."""
        extra = compact_logits.new_full((*compact_logits.shape[:-1], 1), self.unused_logit)
        return torch.log_softmax(torch.cat([compact_logits.float(), extra.float()], dim=-1), dim=-1)

    def expand_rows(self, compact: torch.Tensor) -> torch.Tensor:
        """The full embedding: the compact rows at their ids, zero rows elsewhere."""
        full = compact.new_zeros((self.full_size, *compact.shape[1:]))
        full[torch.tensor(self.used_ids)] = compact
        return full
