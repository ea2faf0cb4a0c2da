"""Speculative verification is lossless: the committed tokens follow the target distribution."""

import collections

import torch

from specexit_core.engine.verify import verify_greedy, verify_sampled


def test_greedy_accepts_matching_prefix_then_corrects():
    logits = torch.tensor([[0, 5, 0], [0, 0, 5], [5, 0, 0], [0, 5, 0]], dtype=torch.float)
    assert verify_greedy(logits, [1, 2, 0]) == [1, 2, 0, 1]  # all accepted + bonus
    assert verify_greedy(logits, [1, 0, 0]) == [1, 2]  # rejected at j=1, corrected
    assert verify_greedy(logits, [2, 2, 0]) == [1]
    assert verify_greedy(logits[:1], []) == [1]


def _tv(c: collections.Counter, probs: dict, n: int) -> float:
    keys = set(c) | set(probs)
    return 0.5 * sum(abs(c[k] / n - probs.get(k, 0.0)) for k in keys)


def test_sampled_verification_matches_target_distribution():
    """Small-vocabulary case: drafts from q, verification against p; the first two committed tokens
    must be distributed as p0 x p1, whatever q is (total variation within sampling noise)."""
    g = torch.Generator().manual_seed(0)
    V, k, N = 5, 2, 40000
    p = torch.softmax(torch.randn(k + 1, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(k, V, generator=g) * 1.5, -1)
    q[0, 3] = 0.0  # the draft can never propose token 3: p's mass there must come from resampling
    q = q / q.sum(-1, keepdim=True)
    assert 0.5 * (p[0] - q[0]).abs().sum() > 0.2  # q really differs from p
    first, pairs = collections.Counter(), collections.Counter()
    for _ in range(N):
        drafts = [int(torch.multinomial(q[j], 1, generator=g)) for j in range(k)]
        out = verify_sampled(p, q, drafts, g)
        first[out[0]] += 1
        if len(out) >= 2:
            pairs[(out[0], out[1])] += 1
    want_first = {i: float(p[0, i]) for i in range(V)}
    assert _tv(first, want_first, N) < 0.015
    assert first[3] > 0
    # second token: given the first was the accepted draft, it follows p1
    n_pairs = sum(pairs.values())
    cond = collections.Counter()
    for (_a, b), c in pairs.items():
        cond[b] += c
    assert _tv(cond, {i: float(p[1, i]) for i in range(V)}, n_pairs) < 0.02


def test_always_accepting_would_fail_the_check():
    """Guard that the statistical test has teeth: accepting every draft gives q, not p."""
    g = torch.Generator().manual_seed(1)
    V, N = 5, 20000
    p = torch.softmax(torch.randn(2, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(1, V, generator=g) * 1.5, -1)
    c = collections.Counter(int(torch.multinomial(q[0], 1, generator=g)) for _ in range(N))
    assert _tv(c, {i: float(p[0, i]) for i in range(V)}, N) > 0.05
