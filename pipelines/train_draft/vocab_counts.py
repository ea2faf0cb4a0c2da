"""Token counts over the labels, computed with Ray Data (one histogram per batch, summed on the
driver); `specexit_core.draft.vocab.draft_vocab_from_counts` turns the sum into the draft vocab
without holding every sequence in memory."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def count_tokens(batch: pa.Table, *, column: str, vocab_size: int) -> dict:
    """Ray Data map_batches: one row holding this batch's token histogram."""
    flat = pc.list_flatten(batch.column(column)).to_numpy(zero_copy_only=False).astype(np.int64)
    return {"counts": [np.bincount(flat, minlength=vocab_size)[:vocab_size].astype(np.int64)]}
