"""The draft vocabulary: the top-N target tokens by frequency, with EAGLE-3's `d2t` / `t2d` maps."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import torch


def build_draft_vocab(
    sequences: Iterable[Iterable[int]], vocab_size: int, draft_vocab_size: int, always: Iterable[int] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (d2t [N] long: target_id - draft_id, t2d [V] bool: target token is in the draft vocab).

    `always` (e.g. `</think>`, the paragraph break, EOS) is included whatever its frequency.
    Ties break by token id so the result is deterministic.
    """
    counts: Counter[int] = Counter()
    for seq in sequences:
        counts.update(int(t) for t in seq)
    forced = sorted(set(int(t) for t in always))
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if t not in forced]
    # pad with unseen ids so the vocab is always exactly N
    rest = [t for t in range(vocab_size) if t not in counts and t not in forced]
    chosen = sorted((forced + ranked + rest)[:draft_vocab_size])
    if len(chosen) < draft_vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} > vocab_size {vocab_size}")
    target_ids = torch.tensor(chosen, dtype=torch.long)
    d2t = target_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    return d2t, t2d
