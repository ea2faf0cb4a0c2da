"""Draft vocabulary from token *counts* (computed over the labels with Ray Data, summed on the driver).

Same result as `specexit_core.draft.vocab.build_draft_vocab` on the same tokens (forced ids first,
then by count, ties by id, padded with unseen ids), without holding every sequence in memory.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch


def count_tokens(batch: pa.Table, *, column: str, vocab_size: int) -> dict:
    """Ray Data map_batches: one row holding this batch's token histogram."""
    flat = pc.list_flatten(batch.column(column)).to_numpy(zero_copy_only=False).astype(np.int64)
    return {"counts": [np.bincount(flat, minlength=vocab_size)[:vocab_size].astype(np.int64)]}


def draft_vocab_from_counts(counts: np.ndarray, draft_vocab_size: int, always: Iterable[int] = ()
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (d2t [N] long: target_id - draft_id, t2d [V] bool)."""
    counts = np.asarray(counts, dtype=np.int64)
    vocab_size = len(counts)
    if draft_vocab_size > vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} > vocab_size {vocab_size}")
    forced = sorted({int(t) for t in always})
    seen = np.nonzero(counts)[0]
    ranked = [int(t) for t in seen[np.lexsort((seen, -counts[seen]))] if int(t) not in set(forced)]
    rest = [t for t in range(vocab_size) if counts[t] == 0 and t not in set(forced)]
    chosen = sorted((forced + ranked + rest)[:draft_vocab_size])
    target_ids = torch.tensor(chosen, dtype=torch.long)
    d2t = target_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    return d2t, t2d
