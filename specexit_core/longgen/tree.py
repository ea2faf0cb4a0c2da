"""The candidate tree verified in one target forward (Medusa-style), and its attention mask.

Node 0 is the root: the last committed token, not yet in the full KV cache. Every other node is a candidate
token one position deeper than its parent; siblings carry distinct tokens (the tree is a trie), which the
lossless sampled verification relies on. Candidates come from two sources, merged into one trie:

* the draft distributions (the drafter's base logits for depth 1, head i for depth i + 1): every path of the
  Medusa-style product of top-k ranks, `widths` per depth (TokenSwift: 1-3-3-3, 40 nodes with the root);
* n-gram reuse: for each depth-1 token, the table's most frequent continuations of it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from specexit_core.longgen.ngram import NgramTable
from specexit_core.typed_config import StrictModel


class TreeConfig(StrictModel):
    widths: list[int] = [1, 3, 3, 3]  # top-k per depth: depth 1 from the base draft, depth i + 1 from head i
    ngram_top_k: int = 20  # n-gram continuations added per depth-1 token (0: no reuse)


@dataclass
class CandidateTree:
    tokens: list[int]  # tokens[0] is the root
    parents: list[int] = field(default_factory=list)  # parents[0] = -1
    depths: list[int] = field(default_factory=list)
    children: list[dict[int, int]] = field(default_factory=list)  # node -> {token: child node}

    @classmethod
    def rooted(cls, root_token: int) -> CandidateTree:
        return cls(tokens=[root_token], parents=[-1], depths=[0], children=[{}])

    def add_path(self, path: list[int] | tuple[int, ...]) -> None:
        node = 0
        for t in path:
            nxt = self.children[node].get(t)
            if nxt is None:
                nxt = len(self.tokens)
                self.tokens.append(t)
                self.parents.append(node)
                self.depths.append(self.depths[node] + 1)
                self.children.append({})
                self.children[node][t] = nxt
            node = nxt

    def __len__(self) -> int:
        return len(self.tokens)

    def path_tokens(self, node: int) -> list[int]:
        """The tokens from the root's child down to `node` (empty for the root)."""
        out = []
        while node > 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]

    def attention_mask(self) -> torch.Tensor:
        """[N, N] bool: node i sees node j iff j is i or one of its ancestors (nodes are in parent-first order)."""
        n = len(self.tokens)
        chains: list[list[int]] = []
        rows: list[int] = []
        for i in range(n):
            p = self.parents[i]
            chain = [*chains[p], i] if p >= 0 else [i]
            chains.append(chain)
            rows.extend([i] * len(chain))
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[torch.tensor(rows), torch.tensor([j for c in chains for j in c])] = True
        return mask


def build_tree(
    root_token: int, draft_logits: torch.Tensor, cfg: TreeConfig, ngrams: NgramTable | None
) -> CandidateTree:
    """draft_logits [D, V]: row 0 the base draft (next token), row i head i; D >= len(cfg.widths)."""
    tree = CandidateTree.rooted(root_token)
    depth = min(len(cfg.widths), draft_logits.shape[0])
    tops = [draft_logits[d].topk(cfg.widths[d]).indices.tolist() for d in range(depth)]
    for ranks in itertools.product(*[range(w) for w in cfg.widths[:depth]]):
        tree.add_path([tops[d][r] for d, r in enumerate(ranks)])
    if ngrams is not None and cfg.ngram_top_k > 0:
        for first in list(tree.children[0]):
            for cont in ngrams.candidates(first, cfg.ngram_top_k):
                tree.add_path((first, *cont))
    return tree
