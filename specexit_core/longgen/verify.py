"""Lossless verification of a candidate tree: walk down from the root, one committed token per level.

`rows[n]` is the target's (penalised) prediction for the position after tree node n, computed in one forward
with the tree attention mask. Both walks return the accepted nodes (root excluded) and one more token (the
target's own at the node where the walk stopped), so every round commits at least one token.

Greedy: move to the child whose token is the target's argmax; stop when there is none. The result is exactly
plain greedy decoding (the longest path that greedy decoding would have produced).

Sampling: multi-draft speculative sampling with deterministic drafts (SpecInfer's recursive rejection; Chen et
al. 2023 and Yang et al. 2024 "multi-draft"), applied at each node to its children in order. With target
distribution p at the node and distinct candidate tokens c_1..c_m (each a point-mass draft):
    accept c_j with probability r_j(c_j), where r_1 = p and r_{j+1} = norm(r_j with c_j's mass removed);
    if all are rejected, sample from r_{m+1}.
P(commit c_j) = prod_{i<j}(1 - r_i(c_i)) * r_j(c_j) = p(c_j), and any other token x gets
(1 - sum_j p(c_j)) * p(x) / (1 - sum_j p(c_j)) = p(x): the committed token follows p exactly, and the walk
continues under the accepted child with that child's own p, so every token is drawn from the target's
conditional -- lossless for any candidates, unlike sampling once per leaf and keeping the longest match
(TokenSwift's code), which favours drafted tokens. `tests/unit/test_longgen_verify.py` checks both claims.
"""

from __future__ import annotations

import torch

from specexit_core.longgen.tree import CandidateTree


def verify_tree_greedy(tree: CandidateTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """logits [N, V] (one row per tree node) -> (accepted nodes, the next token)."""
    best = logits.argmax(-1).tolist()
    node, path = 0, []
    while True:
        child = tree.children[node].get(best[node])
        if child is None:
            return path, best[node]
        path.append(child)
        node = child


def verify_tree_sampled(tree: CandidateTree, probs: torch.Tensor, gen: torch.Generator) -> tuple[list[int], int]:
    """probs [N, V]: the target distribution after each node -> (accepted nodes, the next token)."""
    node, path = 0, []
    while True:
        child, token = _rejection_step(probs[node], tree.children[node], gen)
        if child is None:
            return path, token
        path.append(child)
        node = child


def _rejection_step(p: torch.Tensor, children: dict[int, int], gen: torch.Generator):
    """One node: try its children in order; (child, token) when one is accepted, else (None, a resample)."""
    r = p
    for token, child in children.items():
        if float(torch.rand((), generator=gen, device=p.device)) < float(r[token]):
            return child, token
        r = r.clone()
        r[token] = 0.0
        total = r.sum()
        if total <= 0:  # float round-off when p was (almost) a point mass on a rejected candidate
            r = p.clone()
            for t in children:
                r[t] = 0.0
            total = r.sum()
            if total <= 0:
                return None, int(p.argmax())
        r = r / total
    return None, int(torch.multinomial(r, 1, generator=gen))
