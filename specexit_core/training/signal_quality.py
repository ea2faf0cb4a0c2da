"""Held-out quality of the signal heads: progress MAE and confidence AUROC."""

from __future__ import annotations

import numpy as np


def auroc(scores, labels) -> float:
    """Area under the ROC curve (rank statistic, ties averaged); nan if only one class."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels) > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def signal_metrics(pred: np.ndarray, conf, prog, rem, mask) -> dict[str, float]:
    """pred [N, 3] activated signals; labels [N]; mask [N] bool."""
    m = np.asarray(mask, dtype=bool)
    p = np.asarray(pred)[m]
    return {
        "progress_mae": float(np.abs(p[:, 1] - np.asarray(prog)[m]).mean()),
        "remaining_mae": float(np.abs(p[:, 2] - np.asarray(rem)[m]).mean()),
        "confidence_auroc": auroc(p[:, 0], np.asarray(conf)[m]),
        "confidence_mean_label": float(np.asarray(conf)[m].mean()),
        "n_tokens": int(m.sum()),
    }
