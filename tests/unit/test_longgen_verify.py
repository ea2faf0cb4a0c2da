"""Tree verification is lossless: greedy = plain greedy; sampled = the target's distribution (and a biased
verifier -- TokenSwift's sample-per-leaf, keep-the-longest-match -- fails the same check)."""

import collections

import pytest
import torch

from specexit_core.longgen.tree import CandidateTree
from specexit_core.longgen.verify import verify_tree_greedy, verify_tree_sampled

pytestmark = pytest.mark.usefixtures("one_torch_thread")


V = 5


def _tree() -> CandidateTree:
    # root; depth 1: 0, 1, 3 (draft candidates, point masses); depth 2 under 0: 2, 4; under 3: 0
    t = CandidateTree.rooted(9)
    for path in [(0, 2), (0, 4), (1,), (3, 0)]:
        t.add_path(path)
    return t


def _conditionals(seed: int):
    """The true next-token distribution after every prefix of length 0 and 1 (path-dependent)."""
    g = torch.Generator().manual_seed(seed)
    p0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    p1 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # p1[x1] = p(. | x1)
    return p0, p1


def _rows(tree: CandidateTree, p0, p1) -> torch.Tensor:
    """Row n = the target distribution after node n's path (depth-2 rows: anything, never used for the first 2)."""
    rows = []
    for n in range(len(tree)):
        path = tree.path_tokens(n)
        rows.append(p0 if not path else p1[path[0]] if len(path) == 1 else torch.full((V,), 1.0 / V))
    return torch.stack(rows)


def _tv(c: collections.Counter, probs: dict, n: int) -> float:
    keys = set(c) | set(probs)
    return 0.5 * sum(abs(c[k] / n - probs.get(k, 0.0)) for k in keys)


def _first_two(verifier, n: int, seed: int) -> collections.Counter:
    """Joint counts of the first two committed tokens; when a round commits only one, the second comes from
    the true conditional (what the next round -- or plain decoding -- would draw)."""
    tree = _tree()
    p0, p1 = _conditionals(seed)
    rows = _rows(tree, p0, p1)
    g = torch.Generator().manual_seed(seed + 100)
    pairs = collections.Counter()
    for _ in range(n):
        path, nxt = verifier(tree, rows, g)
        toks = [tree.tokens[i] for i in path] + [nxt]
        if len(toks) < 2:
            toks.append(int(torch.multinomial(p1[toks[0]], 1, generator=g)))
        pairs[(toks[0], toks[1])] += 1
    return pairs


def _joint(seed: int) -> dict:
    p0, p1 = _conditionals(seed)
    return {(a, b): float(p0[a] * p1[a, b]) for a in range(V) for b in range(V)}


N = 8000
# 25 cells: the expected TV of an exact sampler is ~ 0.5 * sum_k sqrt(2 p_k / (pi N)) <= 0.5 * 5 * sqrt(2 / (pi N))
# ~ 0.022 at N = 8000; 0.04 is about twice that, while the biased verifier below is off by > 0.1
BOUND = 0.04


def test_greedy_walk_follows_argmax_then_emits_the_target_token():
    tree = _tree()
    logits = torch.zeros(len(tree), V)
    want = {(): 0, (0,): 4, (0, 4): 1}
    for n in range(len(tree)):
        logits[n, want.get(tuple(tree.path_tokens(n)), 2)] = 5.0
    path, nxt = verify_tree_greedy(tree, logits)
    assert [tree.tokens[i] for i in path] == [0, 4] and nxt == 1
    logits[0] = 0
    logits[0, 2] = 5.0  # no child carries the argmax: nothing accepted, the target's token committed
    assert verify_tree_greedy(tree, logits) == ([], 2)


def test_sampled_tree_verification_matches_target_distribution():
    p0, _ = _conditionals(3)
    assert float(p0[[0, 1, 3]].sum()) < 0.95  # the residual matters: tokens 2 and 4 only come from resampling
    pairs = _first_two(verify_tree_sampled, N, 3)
    assert _tv(pairs, _joint(3), N) < BOUND
    assert sum(c for (a, _), c in pairs.items() if a in (2, 4)) > 0


def _sample_per_leaf(tree: CandidateTree, rows: torch.Tensor, g: torch.Generator):
    """TokenSwift's sampled verification: one independent sample per node along every root-to-leaf path, keep
    the leaf path with the longest match. Several tries at the same position favour drafted tokens."""
    leaves = [n for n in range(len(tree)) if not tree.children[n]]
    best = None
    for leaf in leaves:
        chain = [leaf]
        while tree.parents[chain[-1]] > 0:
            chain.append(tree.parents[chain[-1]])
        chain.reverse()
        node, path = 0, []
        for child in chain:
            x = int(torch.multinomial(rows[node], 1, generator=g))
            if x != tree.tokens[child]:
                break
            path.append(child)
            node = child
        else:
            x = int(torch.multinomial(rows[node], 1, generator=g))
        if best is None or len(path) > len(best[0]):
            best = (path, x)
    return best


def _no_residual_update(tree: CandidateTree, rows: torch.Tensor, g: torch.Generator):
    """Accept each child with p(child) but never renormalise after a rejection (then resample from p)."""
    node, path = 0, []
    while True:
        for token, child in tree.children[node].items():  # noqa: B007 (child used after the loop)
            if float(torch.rand((), generator=g)) < float(rows[node, token]):
                break
        else:
            return path, int(torch.multinomial(rows[node], 1, generator=g))
        path.append(child)
        node = child


@pytest.mark.parametrize("biased", [_sample_per_leaf, _no_residual_update])
def test_the_check_detects_a_biased_verifier(biased):
    pairs = _first_two(biased, N // 3, 3)
    assert _tv(pairs, _joint(3), N // 3) > 2 * BOUND
