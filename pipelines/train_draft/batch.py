"""Labeled rows (a Ray Data numpy batch) -> the core `DraftBatch` (right-padded tensors)."""

from __future__ import annotations

import numpy as np
import torch

from specexit_core.training.step import DraftBatch


def collate(batch: dict[str, np.ndarray], *, pad_id: int, eos_id: int, max_len: int | None = None) -> DraftBatch:
    """prompt + completion + EOS per row; token loss on the completion, signal labels on think tokens.

    `max_len` truncates from the right (the prompt is kept; long completions lose their tail)."""
    prompts = [list(map(int, p)) for p in batch["prompt_token_ids"]]
    comps = [list(map(int, c)) for c in batch["completion_token_ids"]]
    seqs = [p + c + [eos_id] for p, c in zip(prompts, comps)]
    if max_len is not None:
        seqs = [s[:max_len] for s in seqs]
    b, n = len(seqs), max(map(len, seqs))
    ids = torch.full((b, n), pad_id, dtype=torch.long)
    att = torch.zeros((b, n), dtype=torch.long)
    lm = torch.zeros((b, n))
    conf, prog, lrem = torch.zeros((b, n)), torch.zeros((b, n)), torch.zeros((b, n))
    mask = torch.zeros((b, n), dtype=torch.bool)
    for r, (p, c, s) in enumerate(zip(prompts, comps, seqs)):
        L = len(s)
        ids[r, :L] = torch.tensor(s)
        att[r, :L] = 1
        lm[r, len(p):L] = 1
        k = max(0, min(len(c), L - len(p)))  # completion tokens that survived truncation
        sl = slice(len(p), len(p) + k)
        conf[r, sl] = torch.as_tensor(np.asarray(batch["confidence"][r][:k], dtype=np.float32))
        prog[r, sl] = torch.as_tensor(np.asarray(batch["progress"][r][:k], dtype=np.float32))
        lrem[r, sl] = torch.as_tensor(np.asarray(batch["log_remaining"][r][:k], dtype=np.float32))
        mask[r, sl] = torch.as_tensor(np.asarray(batch["mask"][r][:k], dtype=bool))
    return DraftBatch(ids, att, lm, conf, prog, lrem, mask)
