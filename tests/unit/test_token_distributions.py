"""The sampling-parity statistic (bench/token_distributions.py): quiet for a lossless speculative
sampler, loud for a biased one, at the sample sizes the vLLM test uses (tests/integration/
test_vllm_plugin.py::test_speculative_sampling_is_lossless)."""

import random

import numpy as np
import pytest

from specexit_app.bench.token_distributions import (
    ENDED,
    position_matrix,
    same_distribution_test,
    tv_per_position,
)

V, K, LENGTH, N, STARTS = 8, 3, 24, 300, (0, 3, 5)
TOKENS = range(V)


def _chain(seed: int, sharpness: float, base=None) -> list[list[float]]:
    """A Markov chain over V tokens: next-token probabilities given the last token (rows sum to 1)."""
    rng = np.random.default_rng(seed)
    logits = sharpness * rng.standard_normal((V, V)) + (np.log(base) if base is not None else 0)
    p = np.exp(logits - logits.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)).tolist()


TARGET = _chain(1, 1.5)
# the target, perturbed: a draft token is accepted with probability ~0.72, so rejections (where
# the bug below acts) are common; with it the bias is ~0.05 mean TV per position (measured on
# 20k samples), which this test flags at p <= 0.001 for 10 of 10 seeds (a bias of ~0.04: 4 of 10)
DRAFT = _chain(2, 1.2, base=np.array(TARGET))
HOT = _chain(0, 0.0, base=np.array(TARGET) ** (1 / 1.5))  # the target at 1.5x the temperature


def _plain(start: int, rng: random.Random, chain=TARGET) -> list[int]:
    out = [start]
    while len(out) <= LENGTH:
        out.append(rng.choices(TOKENS, chain[out[-1]])[0])
    return out[1:]


def _speculative(start: int, rng: random.Random, biased: bool = False) -> list[int]:
    """Chain speculative sampling (the math of engine/verify.py, in plain Python for speed).
    `biased`: a classic bug -- on rejection resample from p instead of norm(max(p - q, 0))."""
    out = [start]
    while len(out) <= LENGTH:
        drafts = []
        for _ in range(K):
            drafts.append(rng.choices(TOKENS, DRAFT[(drafts or out)[-1]])[0])
        prev = out[-1]
        for t in drafts:
            p, q = TARGET[prev], DRAFT[prev]
            if rng.random() < min(1.0, p[t] / q[t]):
                out.append(t)
                prev = t
                continue
            resid = p if biased else [max(pi - qi, 0.0) for pi, qi in zip(p, q)]
            out.append(rng.choices(TOKENS, resid)[0])
            break
        else:
            out.append(rng.choices(TOKENS, TARGET[prev])[0])
    return out[1 : LENGTH + 1]


def _samples(sampler, seed: int) -> list[np.ndarray]:
    rng = random.Random(seed)
    return [position_matrix([sampler(s, rng) for _ in range(N)], LENGTH) for s in STARTS]


@pytest.fixture(scope="module")
def plain():
    return _samples(_plain, 10)


def test_lossless_speculative_sampling_passes(plain):
    for seed in (11, 12):
        res = same_distribution_test(plain, _samples(_speculative, seed))
        assert res.p_value > 0.01, res.summary()
    assert same_distribution_test(plain, _samples(_plain, 13)).p_value > 0.01


def test_biased_speculative_sampling_is_flagged(plain):
    res = same_distribution_test(plain, _samples(lambda s, r: _speculative(s, r, biased=True), 11))
    assert res.p_value <= 0.001, res.summary()
    assert res.statistic > res.null_q999


def test_a_slightly_hotter_sampler_is_flagged(plain):
    """A temperature 1.5x too high (what a wrong divisor in the sampler does) is caught too."""
    res = same_distribution_test(plain, _samples(lambda s, r: _plain(s, r, HOT), 11))
    assert res.p_value <= 0.001, res.summary()


def test_position_matrix_and_tv():
    m = position_matrix([[1, 2], [1], []], 3)
    assert m.tolist() == [[1, 2, ENDED], [1, ENDED, ENDED], [ENDED, ENDED, ENDED]]
    a = position_matrix([[1, 2], [1, 2]], 2)
    b = position_matrix([[1, 3], [2, 3]], 2)
    assert tv_per_position(a, b).tolist() == [0.5, 1.0]
    same = same_distribution_test([a], [a], rounds=50)
    assert same.statistic == 0 and same.p_value == 1.0
    with pytest.raises(ValueError):
        same_distribution_test([a], [position_matrix([[1]], 1)])
