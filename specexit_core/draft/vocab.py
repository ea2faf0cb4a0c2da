"""The draft vocabulary: the top-N target tokens by frequency, with EAGLE-3's `d2t` / `t2d` maps."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def build_draft_vocab(
    sequences: Iterable[Iterable[int]],
    vocab_size: int,
    draft_vocab_size: int,
    always: Iterable[int] = (),
    prefer: Iterable[int] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """`draft_vocab_from_counts` on the token counts of `sequences` (ids >= vocab_size are ignored)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for seq in sequences:
        ids = np.fromiter((int(t) for t in seq), dtype=np.int64)
        counts += np.bincount(ids[ids < vocab_size], minlength=vocab_size)
    return draft_vocab_from_counts(counts, draft_vocab_size, always, prefer)


def draft_vocab_from_counts(
    counts, draft_vocab_size: int, always: Iterable[int] = (), prefer: Iterable[int] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (d2t [N] long: target_id - draft_id, t2d [V] bool: target token is in the draft vocab)
    from `counts[token_id]` over V = len(counts) target tokens.

    `always` (e.g. `</think>`, EOS) is included whatever its frequency (more of them than N is a
    ValueError); then the `prefer` tokens that occur (e.g. the paragraph breaks), most frequent
    first; then the other tokens by frequency, ties broken by id; then unseen ids (preferred ones
    first), so the vocab is always exactly N. A byte-level BPE tokenizer has hundreds of paragraph
    breaks (Qwen3: 712) of which a model uses a few: forcing them all would crowd a small draft
    vocab with unused ids. Deterministic. (The Ray job counts with Ray Data and calls this on the
    summed counts.)
    """
    counts = np.asarray(counts, dtype=np.int64)
    vocab_size = len(counts)
    if draft_vocab_size > vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} > vocab_size {vocab_size}")
    forced = sorted({int(t) for t in always})
    if len(forced) > draft_vocab_size:
        raise ValueError(
            f"{len(forced)} tokens must be in the draft vocab, more than draft_vocab_size {draft_vocab_size}"
        )
    pref = {int(t) for t in prefer} - set(forced)
    seen = np.nonzero(counts)[0]
    by_count = [int(t) for t in seen[np.lexsort((seen, -counts[seen]))] if int(t) not in forced]
    ranked = [t for t in by_count if t in pref] + [t for t in by_count if t not in pref]
    unseen = [int(t) for t in np.nonzero(counts == 0)[0] if int(t) not in forced]
    rest = [t for t in unseen if t in pref] + [t for t in unseen if t not in pref]
    chosen = sorted((forced + ranked + rest)[:draft_vocab_size])
    target_ids = torch.tensor(chosen, dtype=torch.long)
    d2t = target_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    return d2t, t2d
