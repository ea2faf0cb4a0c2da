"""Pure-function tests of the evaluation: DEER / Dynasor / oracle rules, aggregation, replay, configs."""

from __future__ import annotations

import math
import random

import pytest

from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import grid
from pipelines.evaluate.config import EvalConfig
from pipelines.evaluate.job import aggregate, tally_problems, target_checks
from pipelines.evaluate.rules import (
    best_setting,
    count_think_answer,
    deer_confidence,
    deer_should_exit,
    dynasor_should_exit,
    hedges,
    oracle_cut,
)
from pipelines.report.job import pareto_front
from specexit_core.exit import ExitConfig, decide
from specexit_core.exit.replay import exit_checks, first_exit
from specexit_core.typed_config import load_config
from support.eval_rows import eval_row


def test_deer_confidence_means():
    lps = [math.log(0.5), math.log(0.9), math.log(1.0)]
    assert deer_confidence(lps, skip_first=True) == pytest.approx(0.95)
    assert deer_confidence(lps, skip_first=False) == pytest.approx((0.5 + 0.9 + 1.0) / 3)
    assert deer_confidence(lps, skip_first=True, mean="geometric") == pytest.approx(math.sqrt(0.9))
    assert deer_confidence([math.log(0.3)], skip_first=True) == 0.0  # nothing left after skipping
    assert deer_should_exit([0.0, math.log(0.99)], threshold=0.95)
    assert not deer_should_exit([0.0, math.log(0.9)], threshold=0.95)
    assert not deer_should_exit([math.log(0.96)], threshold=0.95, skip_first=True)  # only the skipped token
    with pytest.raises(ValueError):
        deer_confidence([0.0], mean="harmonic")


def test_dynasor_rule():
    hw = ["wait", "hmm"]
    assert not dynasor_should_exit(["5", "5"], ["5", "5"], window=3, hedge_words=hw)  # too few
    assert dynasor_should_exit(["7", "5", "5", "5"], ["", "5 .", "5 .", "5 ."], window=3, hedge_words=hw)
    assert not dynasor_should_exit(["5", "6", "5"], ["5", "6", "5"], window=3, hedge_words=hw)  # disagree
    assert not dynasor_should_exit(["5", None, "5"], ["5", "", "5"], window=3, hedge_words=hw)  # empty
    assert not dynasor_should_exit(["5", "5", "5"], ["5", "Wait 5", "5"], window=3, hedge_words=hw)  # hedge
    assert hedges("Hmm, 5", hw) and not hedges("awaiting 5", hw)  # whole words only


def test_oracle_cut():
    # breaks at 3, 7, 11; forced answers wrong, right, right -> exit after 7
    assert oracle_cut([3, 7, 11], [False, True, True], True, 15) == 8
    assert oracle_cut([3, 7, 11], [True, False, True], True, 15) == 12  # must *stay* right
    assert oracle_cut([3, 7, 11], [True, True, False], True, 15) == 15  # no break qualifies: natural end
    assert oracle_cut([3], [True], False, 15) is None  # wrong final answer: nothing to cut
    with pytest.raises(ValueError):
        oracle_cut([3], [], True, 5)


def test_count_think_answer():
    E, S = 9, 8
    assert count_think_answer([1, 2, 3, E, 4, 5], think_end_id=E, think_start_id=S, prompt_opened_think=True) == (3, 2)
    assert count_think_answer([4, 5], think_end_id=E, think_start_id=S, prompt_opened_think=False) == (0, 2)
    assert count_think_answer([S, 1, E, 4], think_end_id=E, think_start_id=S, prompt_opened_think=False) == (1, 1)
    assert count_think_answer([1, 2], think_end_id=E, think_start_id=S, prompt_opened_think=True) == (2, 0)


def test_best_setting():
    pts = [
        {"accuracy": 0.9, "think_tokens": 10},
        {"accuracy": 0.95, "think_tokens": 30},
        {"accuracy": 0.99, "think_tokens": 50},
    ]
    assert best_setting(pts, ref_accuracy=1.0, tolerance=0.01)["think_tokens"] == 50
    assert best_setting(pts, ref_accuracy=1.0, tolerance=0.05)["think_tokens"] == 30
    assert best_setting(pts, ref_accuracy=1.0, tolerance=0.0)["think_tokens"] == 50  # none: most accurate
    assert best_setting([], ref_accuracy=1.0, tolerance=0.0) is None


def _row(pid, m, correct, think, lat, setting="", status="ok", drafts=10, acc=20, t=0.0):
    return eval_row(
        pid,
        m,
        correct,
        think=think,
        latency=lat,
        setting=setting,
        status=status,
        drafts=drafts,
        accepted=acc,
        temperature=t,
    )


def test_aggregate_targets_and_tally():
    rows = []
    for i in range(4):
        rows += [
            _row(f"p{i}", "eagle3", True, 100, 1.0),
            _row(f"p{i}", "specexit", True, 40, 0.4),
            _row(f"p{i}", "oracle", True, 35, 0.35),
            _row(f"p{i}", "deer", True, 40, 0.9),
            _row(f"p{i}", "budget", i > 0, 30, 0.3, "32"),
            _row(f"p{i}", "budget", True, 60, 0.6, "64"),
        ]
    rows.append(_row("bad", None, None, None, None, status="error"))
    by_t = aggregate(rows, tolerance=0.01)
    d = by_t["0"]
    assert d["methods"]["eagle3"]["acceptance_length"] == pytest.approx(3.0)
    assert d["methods"]["budget"]["setting"] == 64  # 32 loses 25 points
    assert [p["setting"] for p in d["sweeps"]["budget"]] == [32, 64]
    chk = target_checks(d["methods"])
    assert chk["think_within_1.25x_oracle"]["pass"] and chk["speedup_vs_eagle3"]["pass"]
    assert chk["think_reduction_vs_eagle3"]["pass"] and chk["faster_than_deer_at_equal_or_better_accuracy"]["pass"]
    tal = tally_problems(rows, [f"p{i}" for i in range(4)] + ["bad", "lost"])
    assert tal == {"input_rows": 6, "ok": 4, "errors": 1, "missing": 1, "complete": False}


def test_replay_matches_decide():
    """The calibration replay takes exactly the decision the engines take (specexit_core.exit.decide)."""
    rng = random.Random(0)
    ids = dict(split_token_ids={5}, think_start_id=100, think_end_id=101)
    exits = 0
    for _ in range(30):
        opened_by_model = rng.random() < 0.5  # Qwen3: `<think>` is the completion's first token, not a think token
        comp = [100] * opened_by_model + [rng.choice([1, 2, 3, 5]) for _ in range(rng.randint(5, 60))] + [101, 5, 8]
        sigs = [(rng.random(), rng.random(), rng.random() * 100) for _ in comp]
        for cfg in [
            ExitConfig(),
            ExitConfig(method="progress", progress_threshold=0.5, alpha=0.3),
            ExitConfig(method="confidence_remain", confidence_threshold=0.55, remaining_threshold=60, alpha=0.5),
            ExitConfig(method="progress", progress_threshold=0.4, min_think_tokens=20),
            ExitConfig(enabled=False),
        ]:
            want = decide(comp, sigs, cfg, **ids)
            got = first_exit(exit_checks(comp, sigs, alpha=cfg.alpha, **ids), cfg)
            assert (got.index if got else None) == (want.index if want else None)
            if got is not None:
                assert got.think_tokens == want.think_tokens == got.index + 1 - opened_by_model
            exits += got is not None
    assert exits > 20  # the cases do exit


def test_replay_refuses_a_budget():
    with pytest.raises(ValueError, match="max_think_tokens"):
        first_exit([], ExitConfig(max_think_tokens=10))


def test_grid_dedupes_unused_thresholds():
    cfg = CalibrateConfig(
        output="x.json",
        eval=EvalConfig(output="o", engine={"model": "m"}, draft="d"),
        methods=["progress"],
        alphas=[0.1, 0.3],
    )
    g = grid(cfg)
    assert len(g) == len(cfg.progress_thresholds) * 2
    assert all(e.method == "progress" for e in g)


def test_eval_config_validation(tmp_path):
    with pytest.raises(Exception, match="unknown method"):
        EvalConfig(output="o", engine={"model": "m"}, draft="d", methods=["eagle3", "magic"])
    with pytest.raises(Exception, match="extra"):
        EvalConfig(output="o", engine={"model": "m"}, draft="d", typo=1)
    c = EvalConfig(output="o", engine={"model": "m"}, draft="d", methods=["oracle", "plain"])
    assert c.run_methods() == ["plain", "eagle3", "oracle"]  # the oracle needs the eagle3 trace
    cfg = load_config(EvalConfig, "examples/toy/evaluate.yaml", overrides={"output": str(tmp_path / "x"), "limit": 3})
    assert cfg.limit == 3 and cfg.output == str(tmp_path / "x") and cfg.draft.startswith("/")


def test_pareto_front():
    assert pareto_front([(10, 50), (20, 40), (30, 90), (5, 10), (30, 80)]) == [(5, 10), (10, 50), (30, 90)]


def test_targets_come_from_the_recipe():
    """The targets block is per recipe: the toy's defaults (issue #7) or a teacher's own (issue #13:
    1.3x the oracle, 1.6x over EAGLE-3, no think-reduction bound), each a checked bound."""
    from pipelines.evaluate.config import TargetsConfig
    from specexit_app.demo_config import load_demo_config
    from specexit_core.typed_config import read_yaml

    m = {
        "eagle3": {"n": 10, "think_tokens": 100.0, "latency_s": 1.7, "accuracy": 0.9},
        "specexit": {"n": 10, "think_tokens": 64.0, "latency_s": 1.0, "accuracy": 0.9},
        "oracle": {"n": 10, "think_tokens": 50.0, "latency_s": 0.5, "accuracy": 0.9},
    }
    toy = target_checks(m)  # 1.28x the oracle, 36% fewer tokens, 1.7x faster
    assert not toy["think_within_1.25x_oracle"]["pass"] and not toy["speedup_vs_eagle3"]["pass"]
    assert not toy["think_reduction_vs_eagle3"]["pass"]
    for name in ("qwen3-like", "r1-llama-like"):  # the recipe each teacher's demo evaluates with
        raw = read_yaml(load_demo_config(teacher=name).evaluate)["targets"]
        tg = TargetsConfig(**raw)
        chk = target_checks(m, tg)
        assert set(chk) == {"think_within_1.3x_oracle", "speedup_vs_eagle3", "accuracy_within_1_point_of_eagle3"}
        assert all(c["pass"] for c in chk.values())
        slow = target_checks({**m, "specexit": {**m["specexit"], "latency_s": 1.2}}, tg)["speedup_vs_eagle3"]
        assert not slow["pass"] and slow["miss_by"].startswith("0.18x short")
    with pytest.raises(ValueError):
        TargetsConfig(speedup_vs_eagle3_min=0)
    with pytest.raises(ValueError):
        TargetsConfig(unknown=1)


@pytest.mark.parametrize("opened_by_model", [False, True])
def test_calibration_replay_counts_think_tokens_as_the_evaluation_does(opened_by_model):
    """An exit replayed on a trace keeps the think tokens the engine's exited completion has, counted
    by the evaluation's rule: a `<think>` the model writes (Qwen3) is not one (it was counted once)."""
    from pipelines.calibrate.job import replay
    from pipelines.evaluate.rules import count_think_answer

    ids = dict(split=[5], think_start=100, think_end=101)
    body = [1, 2, 5, 3, 3, 5, 2, 5, 1]
    comp = [100] * opened_by_model + body + [101, 7, 8]
    sigs = [(0.99, 0.99, 1.0)] * len(comp)
    breaks = [i for i, t in enumerate(comp) if t == 5]
    trace = {
        "completion": comp,
        "signals": sigs,
        "correct": True,
        "think_tokens": len(body),
        "probes": {b: True for b in breaks},
    }
    cfg = ExitConfig(method="confidence", confidence_threshold=0.5, alpha=1.0)
    (pt,) = replay([trace], [cfg], ids)
    exited = comp[: breaks[0] + 1] + [101]  # what the engine writes: </think> right after the first break
    want, _ = count_think_answer(exited, think_end_id=101, think_start_id=100, prompt_opened_think=not opened_by_model)
    assert pt["think_tokens"] == want == 3
