"""The vectorised replay (`CheckTable` / `first_exits`, and calibration's `replay_outcomes` built on
them) exits exactly where `first_exit` does, one trace and one setting at a time."""

import random

import pytest

from pipelines.calibrate.job import exit_result, replay_outcomes
from specexit_core.exit import ExitConfig
from specexit_core.exit.policy import ExitCheck
from specexit_core.exit.replay import CheckTable, exit_checks, first_exit, first_exits

SPLIT, START, END = 7, 1, 2


def _settings() -> list[ExitConfig]:
    rng = random.Random(3)
    out = [ExitConfig(), ExitConfig(enabled=False), ExitConfig(min_think_tokens=12)]
    for method in ("confidence", "progress", "remain", "confidence_progress", "confidence_progress_remain"):
        for _ in range(12):
            out.append(
                ExitConfig(
                    method=method,
                    confidence_threshold=rng.choice([0.0, 0.3, 0.5, 0.8, 1.0]),
                    progress_threshold=rng.choice([0.0, 0.2, 0.5, 0.9]),
                    remaining_threshold=rng.choice([1.0, 10.0, 40.0, 200.0]),
                    min_think_tokens=rng.choice([0, 0, 5, 30]),
                )
            )
    return out


def _checks(rng: random.Random, n: int) -> list[ExitCheck]:
    think = sorted(rng.sample(range(1, 200), n))
    return [
        ExitCheck(
            index=t + 1,
            think_tokens=t,
            smoothed={
                "confidence": rng.choice([rng.random(), 0.5, 0.8]),  # exact ties with thresholds too
                "progress": rng.random(),
                "remaining": rng.choice([rng.uniform(0, 100), 10.0]),
            },
        )
        for t in think
    ]


def test_first_exits_equals_first_exit_for_every_trace_and_setting():
    rng = random.Random(0)
    per_trace = [_checks(rng, rng.choice([0, 1, 3, 10, 30])) for _ in range(60)]
    table = CheckTable(per_trace)
    for cfg in _settings():
        got = first_exits(table, cfg).tolist()
        for checks, j in zip(per_trace, got):
            want = first_exit(checks, cfg)
            assert (checks[j] if j >= 0 else None) == want, cfg


def test_a_budget_cannot_be_replayed_either_way():
    with pytest.raises(ValueError, match="max_think_tokens budget needs the engine"):
        first_exits(CheckTable([]), ExitConfig(max_think_tokens=10))


def _trace(rng: random.Random) -> dict:
    """A dev trace as `load_traces` gives it: tokens with paragraph breaks, signals, break probes."""
    n = rng.randint(5, 80)
    body = [rng.choice([SPLIT, 20, 21, 22]) for _ in range(n)]
    completion = [START, *body, END, 30, 31]
    signals = [(rng.random(), rng.random(), rng.uniform(0, 60)) for _ in completion]
    breaks = [i for i, t in enumerate(completion) if t == SPLIT]
    probes = {i: rng.random() < 0.7 for i in breaks}
    return {
        "id": str(rng.random()),
        "completion": completion,
        "signals": signals,
        "probes": probes,
        "answers": {i: str(int(ok)) for i, ok in probes.items()},
        "final_answer": "1",
        "correct": True,
        "think_tokens": n,
    }


def test_replay_outcomes_equal_the_per_setting_loop():
    rng = random.Random(1)
    traces = [_trace(rng) for _ in range(40)]
    ids = {"split": [SPLIT], "think_start": START, "think_end": END}
    settings = [s.with_overrides({"alpha": a}) for s in _settings()[:20] for a in (0.1, 0.5)]
    got = replay_outcomes(traces, settings, ids, exit_result)
    for s, row in zip(settings, got):
        for tr, res in zip(traces, row):
            checks = exit_checks(
                tr["completion"],
                tr["signals"],
                alpha=s.alpha,
                split_token_ids=[SPLIT],
                think_start_id=START,
                think_end_id=END,
                in_think=False,
            )
            assert res == exit_result(tr, first_exit(checks, s))
