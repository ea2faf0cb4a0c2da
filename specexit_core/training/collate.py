"""Labeled traces -> one right-padded `DraftBatch`: the one collate rule of the single-process
trainer (`specexit_core.toy.draft_build`) and the Ray Train job (`pipelines.train_draft.batch`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from specexit_core.training.step import DraftBatch

SIGNAL_LABELS = ("confidence", "progress", "log_remaining", "mask")  # per completion token (TraceLabels)


def collate(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    labels: Mapping[str, Sequence],
    *,
    pad_id: int,
    eos_id: int,
    max_len: int | None = None,
) -> DraftBatch:
    """prompt + completion + EOS per row; token loss on the completion, signal labels on its tokens.

    `labels[name][row]` is the row's per-completion-token array for each name in SIGNAL_LABELS
    (other keys are ignored). `max_len` truncates from the right (the prompt is kept; long
    completions lose their tail)."""
    prompts = [[int(t) for t in p] for p in prompts]
    comps = [[int(t) for t in c] for c in completions]
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
        lm[r, len(p) : L] = 1
        k = max(0, min(len(c), L - len(p)))  # completion tokens that survived truncation
        sl = slice(len(p), len(p) + k)
        conf[r, sl] = torch.as_tensor(np.asarray(labels["confidence"][r][:k], dtype=np.float32))
        prog[r, sl] = torch.as_tensor(np.asarray(labels["progress"][r][:k], dtype=np.float32))
        lrem[r, sl] = torch.as_tensor(np.asarray(labels["log_remaining"][r][:k], dtype=np.float32))
        mask[r, sl] = torch.as_tensor(np.asarray(labels["mask"][r][:k], dtype=bool))
    return DraftBatch(ids, att, lm, conf, prog, lrem, mask)
