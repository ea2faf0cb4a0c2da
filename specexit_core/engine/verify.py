"""Verification of a chain of draft tokens: the accept/reject math, as pure functions.

Both return the committed tokens of one round: the accepted prefix of the drafts plus one more
token (the target's correction at the first rejection, or a bonus token when all were accepted).
"""

from __future__ import annotations

import torch


def verify_greedy(target_logits: torch.Tensor, drafts: list[int]) -> list[int]:
    """target_logits [k+1, V]: row j is the target's prediction for the position of drafts[j]."""
    out = []
    for j, t in enumerate(drafts):
        best = int(target_logits[j].argmax())
        out.append(best)
        if best != t:
            return out
    out.append(int(target_logits[len(drafts)].argmax()))
    return out


def verify_sampled(p: torch.Tensor, q: torch.Tensor, drafts: list[int], gen: torch.Generator) -> list[int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), lossless for any q.

    p [k+1, V] target probabilities, q [k, V] draft probabilities the drafts were sampled from.
    Draft j is kept with probability min(1, p_j(t) / q_j(t)); at the first rejection the token
    is resampled from norm(max(p_j - q_j, 0)); if all are kept, a bonus token comes from p_k.
    """
    out = []
    for j, t in enumerate(drafts):
        if torch.rand((), generator=gen) < torch.clamp(p[j, t] / q[j, t], max=1.0):
            out.append(t)
            continue
        resid = torch.clamp(p[j] - q[j], min=0)
        total = resid.sum()
        dist = resid / total if total > 0 else p[j]
        out.append(int(torch.multinomial(dist, 1, generator=gen)))
        return out
    out.append(int(torch.multinomial(p[len(drafts)], 1, generator=gen)))
    return out
