"""`specexit signals` (pipelines/calibrate/signal_quality.py): the measures of the exit signals on a
run's traces, on hand-made traces whose answers are known."""

import itertools
import random

import pytest

from pipelines.calibrate.signal_quality import (
    auroc,
    confidence_quality,
    exit_headroom,
    oracle_outcome,
    pareto_front,
    regression_quality,
    reliability,
)

IDS = {"think_start": 1, "think_end": 2, "split": [3]}


def brute_auroc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auroc_is_the_probability_a_right_break_outranks_a_wrong_one():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 30)
        scores = [rng.choice([0.1, 0.2, 0.5, rng.random()]) for _ in range(n)]  # ties included
        labels = [rng.random() < 0.5 for _ in range(n)]
        if any(labels) and not all(labels):
            assert auroc(scores, labels) == pytest.approx(brute_auroc(scores, labels))
    assert auroc([0.1, 0.9], [False, True]) == 1.0 and auroc([0.5, 0.5], [True, True]) is None


def test_reliability_bins_hold_each_break_once():
    table = reliability([0.05, 0.15, 0.12, 0.95, 1.0], [False, True, False, True, True])
    assert [b["n"] for b in table] == [1, 2, 2] and table[1]["fraction_right"] == 0.5
    assert table[-1]["bin"] == [0.9, 1.0] and table[-1]["mean_confidence"] == pytest.approx(0.975)


def trace(signals, probes, completion=None, correct=True):
    """A toy-shaped trace: thinking opened by the prompt, breaks (3) at 2 and 5, `</think>` (2) at 7."""
    completion = completion or [9, 9, 3, 9, 9, 3, 9, 2, 9]
    return {
        "completion": completion,
        "signals": signals,
        "probes": probes,
        "correct": correct,
        "think_tokens": completion.index(2),
        "oracle_think": 0,
    }


def true_signals(completion, conf=0.5):
    end = completion.index(2)
    return [(conf, (i + 1) / end, float(end - i - 1)) if i < end else (conf, 0.0, 0.0) for i in range(len(completion))]


def test_perfect_progress_and_remaining_have_no_error_and_a_constant_guess_does():
    c = [9, 9, 3, 9, 9, 3, 9, 2, 9]
    perfect = regression_quality([trace(true_signals(c), {})], IDS)
    assert perfect["tokens"] == 7 and perfect["progress_mae"] < 1e-6 and perfect["remaining_mae_tokens"] < 1e-6
    assert [b["tokens"] for b in perfect["by_position"]] == [1, 1, 2, 1, 2]  # fifths: progress 1/7 ... 7/7
    flat = regression_quality([trace([(0.5, 0.5, 3.0)] * len(c), {})], IDS)
    assert flat["progress_mae"] > 0.2 and flat["remaining_mae_tokens"] > 1
    # Qwen3-style: the model writes <think> (1) itself; the truth starts after it
    q = [1, 9, 3, 9, 2]
    sig = [(0.5, 0.0, 0.0)] + [(0.5, (i + 1) / 3, 3.0 - i - 1) for i in range(3)] + [(0.5, 0.0, 0.0)]
    assert regression_quality([trace(sig, {}, completion=q)], IDS)["progress_mae"] < 1e-6


def test_confidence_ranks_right_breaks_and_the_oracle_is_where_the_answer_stays_right():
    c = [9, 9, 3, 9, 9, 3, 9, 2, 9]
    sig = true_signals(c)
    sig[2], sig[5] = (0.2, *sig[2][1:]), (0.9, *sig[5][1:])
    tr = trace(sig, {2: False, 5: True})
    q = confidence_quality([tr])
    assert (q["breaks"], q["right"], q["auroc"]) == (2, 1, 1.0)
    assert oracle_outcome(tr, IDS) == (True, 6)  # think tokens up to and including the break at 5
    assert oracle_outcome(trace(sig, {2: False, 5: False}, correct=False), IDS) == (False, 7)
    # right at 2 but wrong again at 5: the answer does not stay right before the end, no oracle exit
    assert oracle_outcome(trace(sig, {2: True, 5: False}), IDS) == (True, 7)
    assert oracle_outcome(trace(sig, {2: True, 5: True}), IDS) == (True, 3)


def test_the_front_keeps_only_settings_nothing_beats_on_both_counts():
    pts = [
        {"think_tokens": 10, "accuracy": 0.5},
        {"think_tokens": 12, "accuracy": 0.4},  # beaten
        {"think_tokens": 20, "accuracy": 0.9},
        {"think_tokens": 20, "accuracy": 0.8},  # beaten
        {"think_tokens": 30, "accuracy": 0.9},  # no better
        {"think_tokens": 40, "accuracy": 1.0},
    ]
    assert [(p["think_tokens"], p["accuracy"]) for p in pareto_front(pts)] == [(10, 0.5), (20, 0.9), (40, 1.0)]
    c = [9, 9, 3, 9, 9, 3, 9, 2, 9]
    h = exit_headroom([trace(true_signals(c), {2: False, 5: True})], pts, IDS)
    assert h["eagle3"] == {"accuracy": True, "think_tokens": 7} and h["oracle"]["think_tokens"] == 6


def test_the_measured_table_in_pipelines_readme_is_the_committed_json():
    """pipelines/README.md § Measuring the signals quotes docs/results/signal_quality/ (rounded as printed)."""
    import json

    from support.paths import REPO_ROOT

    text = (REPO_ROOT / "pipelines" / "README.md").read_text()
    for name in ("toy_cpu", "qwen3_like_cpu", "qwen3_like_dev400_cpu"):
        res = json.loads((REPO_ROOT / "docs" / "results" / "signal_quality" / f"{name}.json").read_text())
        for r in res["by_temperature"].values():
            c, g, h = r["confidence"], r["regression"], r["headroom"]
            e = h["eagle3"]
            best = next(p for p in h["front"] if p["accuracy"] >= e["accuracy"] - 0.01)
            row = (
                f"| {c['auroc']:.2f} | {g['progress_mae']:.2f} | {g['remaining_mae_tokens']:.0f} | "
                f"{best['think_tokens']:.1f} (EAGLE-3 {e['think_tokens']:.1f}) | {h['oracle']['think_tokens']:.1f} |"
            )
            assert row in text, row
