"""studies/eval_time_by_method.py and studies/summarise_pyspy.py: the summaries behind the evaluation-time
and engine-step figures in docs/ (raw JSON in docs/results/)."""

from __future__ import annotations

from support.paths import load_script


def _load(name: str):
    return load_script(f"studies/{name}.py")


def test_eval_time_sums_per_method_and_temperature():
    lines = [
        "\x1b[36m(MapWorker pid=1)\x1b[0m [evaluate] T=0 budget/64: 22 problem(s) batched in 10.0s",
        "\x1b[36m(MapWorker pid=2)\x1b[0m [evaluate] T=0 budget/128: 23 problem(s) batched in 20.0s",
        "[evaluate] T=0.6 eagle3: 22 problem(s) batched in 30.0s",
        "[evaluate] T=0 budget sweep (replayed): 22 problem(s) batched in 5.0s",  # a label with spaces
        "[evaluate] T=0 toy-test-1: 1 problem(s) timed, every method one request at a time, in 40.0s",
        "[evaluate] 22 untimed problems batched in 99.0s",  # a batch total: not a method line
    ]
    out = _load("eval_time_by_method").time_by_method(lines)
    got = {(r["method"], r["temperature"]): r["actor_seconds"] for r in out["rows"]}
    assert got == {
        ("budget", "0"): 30.0,
        ("eagle3", "0.6"): 30.0,
        ("timed problems", "0"): 40.0,
        ("budget sweep (replayed)", "0"): 5.0,
    }
    assert out["actor_seconds"] == 105.0 and out["rows"][0]["share"] == round(40 / 105, 3)


def test_pyspy_shares_count_a_function_once_per_sample():
    stacks = ["main (a.py:1);step (b.py:2);head (c.py:3) 6", "main (a.py:1);step (b.py:2);step (b.py:9) 4"]
    out = _load("summarise_pyspy").inclusive_shares(stacks, top=10)
    shares = {r["function"]: r["share"] for r in out["inclusive"]}
    assert out["samples"] == 10 and shares == {"main": 1.0, "step": 1.0, "head": 0.6}  # recursion counted once
