import random

from specexit_core.toy.task import (
    MAX_OPERAND,
    MAX_OPS,
    MAX_VALUE,
    MIN_OPS,
    Problem,
    extract_answer,
    grade,
    is_hard,
    parse_problem,
    problems,
    random_problem,
)


def test_generator_is_deterministic_and_seeded():
    assert problems("test", 20, seed=0) == problems("test", 20, seed=0)
    assert problems("test", 20, seed=0) != problems("test", 20, seed=1)


def test_splits_are_disjoint_and_sized():
    sets = {s: {p.uid for p in problems(s, 300)} for s in ("train", "dev", "test")}
    assert all(len(v) == 300 for v in sets.values())  # distinct within a split
    assert not (sets["train"] & sets["dev"]) and not (sets["train"] & sets["test"]) and not (sets["dev"] & sets["test"])
    assert all(p.split == "test" for p in problems("test", 50))


def test_problems_stay_in_range():
    rng = random.Random(3)
    for _ in range(2000):
        p = random_problem(rng)
        assert MIN_OPS <= len(p.steps) <= MAX_OPS
        assert 0 <= p.start <= MAX_OPERAND
        assert all(0 <= b <= MAX_OPERAND for _, b in p.steps)
        assert all(0 <= v <= MAX_VALUE for v in p.values())


def test_left_to_right_semantics():
    p = Problem(7, (("+", 5), ("*", 3), ("-", 4)))
    assert p.values() == [7, 12, 36, 32] and p.answer == 32
    assert p.text == "7 + 5 * 3 - 4"
    assert parse_problem(p.prompt) == p


def test_hard_steps():
    assert is_hard(27, "+", 8) and not is_hard(21, "+", 8)
    assert is_hard(23, "-", 5) and not is_hard(28, "-", 5)
    assert is_hard(12, "*", 3) and not is_hard(5, "*", 2)


def test_grader():
    assert extract_answer("x = 3\n\n</think>\n\nThe answer is 42 .") == 42
    assert extract_answer("1 + 2 = 3 </think> no number") is None
    assert extract_answer("The answer is 7 .") == 7
    assert grade("...</think>\n\nThe answer is 42 .", 42)
    assert not grade("...</think>\n\nThe answer is 41 .", 42)
    assert not grade("", 42)
