"""Length-bucketed batches of the draft trainer (specexit_core/training/length_buckets.py)."""

import random

import pytest

from specexit_core.training.length_buckets import length_buckets


def _padded(lengths, batches):
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def test_every_row_once_in_runs_of_similar_length():
    rng = random.Random(0)
    lengths = [rng.randint(40, 220) for _ in range(37)]
    batches = length_buckets(lengths, 8, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(37))
    assert sorted(map(len, batches)) == [5, 8, 8, 8, 8]
    # each batch is a contiguous run of the sorted lengths: no row outside a batch lies strictly
    # between two of its rows
    for b in batches:
        lo, hi = min(lengths[i] for i in b), max(lengths[i] for i in b)
        inside = [i for i, n in enumerate(lengths) if lo < n < hi]
        assert set(inside) <= set(b)


def test_order_depends_on_the_seed_alone():
    """Two workers with different rows but the same seed take the same length rank at each step."""
    rng = random.Random(1)
    a = [rng.randint(40, 220) for _ in range(32)]
    b = [rng.randint(40, 220) for _ in range(32)]
    rank = lambda lengths, batches: [sorted(lengths).index(max(lengths[i] for i in bt)) // 8 for bt in batches]  # noqa: E731
    assert rank(a, length_buckets(a, 8, seed=5)) == rank(b, length_buckets(b, 8, seed=5))
    orders = {tuple(map(tuple, length_buckets(a, 8, seed=s))) for s in range(6)}
    assert len(orders) > 1


def test_pads_less_than_random_batches():
    rng = random.Random(2)
    lengths = [rng.randint(40, 220) for _ in range(64)]
    shuffled = list(range(64))
    rng.shuffle(shuffled)
    random_batches = [shuffled[s : s + 8] for s in range(0, 64, 8)]
    assert _padded(lengths, length_buckets(lengths, 8, seed=0)) < 0.8 * _padded(lengths, random_batches)


def test_rejects_empty_batches():
    with pytest.raises(ValueError):
        length_buckets([3, 4], 0, seed=0)
