"""Bootstrap intervals (paired by problem), the per-problem method order, the calibration grid's
edge flag, and how aggregation uses them (pure functions, no engine)."""

import pytest

from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import grid_edges
from pipelines.evaluate.intervals import accuracy_ci95, paired_diff_ci95, paired_ratio_ci95, within_points
from pipelines.evaluate.job import aggregate, target_checks
from pipelines.evaluate.order import method_order
from specexit_core.exit import ExitConfig
from support.eval_rows import eval_row


def test_accuracy_ci95_contains_the_mean_and_is_seeded():
    x = [True] * 80 + [False] * 20
    lo, hi = accuracy_ci95(x)
    assert lo < 0.8 < hi and 0.05 < hi - lo < 0.25
    assert accuracy_ci95(x) == [lo, hi]  # same seed, same interval
    assert accuracy_ci95(x, seed=1) != [lo, hi]
    assert accuracy_ci95([True] * 10) == [1.0, 1.0]
    assert accuracy_ci95([]) is None


def test_paired_diff_cancels_what_both_share():
    ids = [f"p{i}" for i in range(100)]
    a = {k: i % 3 != 0 for i, k in enumerate(ids)}  # 66% right
    same = paired_diff_ci95(a, dict(a))
    assert same == {"points": 0.0, "ci95": [0.0, 0.0], "n": 100, "problems": 100}  # identical: no uncertainty
    b = dict(a, p1=False)  # one problem of 100 differs
    d = paired_diff_ci95(a, b)
    assert d["points"] == pytest.approx(1.0) and d["ci95"][0] == 0.0 and 1.0 <= d["ci95"][1] <= 4.0
    assert within_points(paired_diff_ci95(b, a), 1.0) is False  # -1 point: the interval reaches below -1
    assert within_points(same, 1.0) is True and within_points(None, 1.0) is None
    assert paired_diff_ci95({"x": True}, {"y": True}) is None  # no shared problem
    assert paired_diff_ci95({"x": True, "z": True}, {"x": False})["n"] == 1  # only shared problems count


def test_samples_of_one_problem_are_resampled_together():
    """Keys `(problem, sample)`: the bootstrap draws problems, each with all its samples. Samples that
    agree within a problem carry no more evidence than one: the interval is that of the problems, not
    the narrower one of independent samples; one sample per problem is the plain bootstrap, draw for draw."""
    per_problem = {f"p{i}": i % 4 != 0 for i in range(40)}  # 75% right, problem by problem
    copies = {(p, j): ok for p, ok in per_problem.items() for j in range(8)}  # 8 samples, all alike
    assert accuracy_ci95(list(copies.values()), keys=list(copies)) == accuracy_ci95(list(per_problem.values()))
    independent = accuracy_ci95(list(copies.values()))  # the same 320 values taken as independent
    clustered = accuracy_ci95(list(copies.values()), keys=list(copies))
    assert clustered[1] - clustered[0] > 2 * (independent[1] - independent[0])
    a = {(p, j): ok for (p, j), ok in copies.items()}
    b = dict(a)
    for j in range(8):
        b[("p1", j)] = not a[("p1", j)]  # one problem flips in all its samples
    d, single = (
        paired_diff_ci95(b, a),
        paired_diff_ci95({p: b[(p, 0)] for p in per_problem}, {p: a[(p, 0)] for p in per_problem}),
    )
    assert d["n"] == 320 and d["problems"] == 40
    assert d["points"] == pytest.approx(single["points"]) and d["ci95"] == pytest.approx(single["ci95"])


def test_paired_ratio_is_the_speedup_of_means_with_its_interval():
    ids = [f"p{i}" for i in range(10)]
    eagle = {k: 1.0 + 0.1 * i for i, k in enumerate(ids)}
    exact = paired_ratio_ci95(eagle, {k: v / 2 for k, v in eagle.items()})
    assert exact["ratio"] == pytest.approx(2.0) and exact["ci95"] == pytest.approx([2.0, 2.0]) and exact["n"] == 10
    noisy = {k: v / (1.5 if i % 2 else 2.5) for i, (k, v) in enumerate(eagle.items())}  # 1.5x and 2.5x alternate
    r = paired_ratio_ci95(eagle, noisy)
    assert r["ci95"][0] < r["ratio"] < r["ci95"][1] and r["ci95"][0] > 1.5 and r["ci95"][1] < 2.5
    assert paired_ratio_ci95(eagle, noisy) == r  # seeded
    assert paired_ratio_ci95({"x": 1.0}, {"y": 1.0}) is None and paired_ratio_ci95({}, {}) is None


def test_method_order_shuffles_per_seed_and_keeps_oracle_after_eagle3():
    jobs = [("plain", ""), ("eagle3", ""), ("specexit", ""), ("budget", "32"), ("deer", ""), ("oracle", "")]
    orders = {tuple(method_order(jobs, s)) for s in range(50)}
    assert len(orders) > 10  # not a fixed order
    for o in orders:
        assert sorted(o) == sorted(jobs)
        names = [m for m, _ in o]
        assert names.index("eagle3") < names.index("oracle")
    firsts = {o[0][0] for o in orders}
    assert "specexit" in firsts and "eagle3" in firsts  # any method can go first
    assert method_order(jobs, 7) == method_order(jobs, 7)


def test_grid_edges_flags_a_choice_at_an_end():
    cfg = CalibrateConfig(output="x.json", eval={"output": "o", "engine": {"model": "m"}, "draft": "d"})
    assert grid_edges(cfg, ExitConfig(method="confidence", confidence_threshold=0.5, alpha=0.3)) == []
    low = grid_edges(cfg, ExitConfig(method="confidence", confidence_threshold=min(cfg.confidence_thresholds)))
    assert len(low) == 1 and "confidence_threshold" in low[0] and "lowest" in low[0]
    hi = grid_edges(cfg, ExitConfig(method="progress", progress_threshold=0.3, alpha=max(cfg.alphas)))
    assert len(hi) == 1 and hi[0].startswith("alpha") and "highest" in hi[0]
    # the paper's values lie inside the default grid, and so does the toy's earlier choice
    assert grid_edges(cfg, ExitConfig()) == []


def _row(pid, m, correct, lat, setting="", timed=True):
    return eval_row(pid, m, correct, latency=lat, setting=setting, info={} if timed else {"timed": False})


def test_aggregate_intervals_and_timed_subset():
    rows = []
    for i in range(40):
        timed = i < 10
        rows += [
            _row(f"p{i}", "eagle3", True, 1.0 if timed else None, timed=timed),
            _row(f"p{i}", "specexit", i != 3, 0.4 if timed else None, timed=timed),
            _row(f"p{i}", "deer", True, 0.5 if timed else 9.0, timed=timed),  # untimed latency left out
            _row(f"p{i}", "budget", True, 0.3 if timed else None, "32", timed=timed),
        ]
    d = aggregate(rows, tolerance=0.01)["0"]
    s, e = d["methods"]["specexit"], d["methods"]["eagle3"]
    assert s["latency_s"] == pytest.approx(0.4) and s["latency_n"] == 10
    assert d["methods"]["deer"]["latency_s"] == pytest.approx(0.5)
    assert s["accuracy"] == pytest.approx(39 / 40) and s["accuracy_ci95"][0] < 39 / 40 <= s["accuracy_ci95"][1]
    assert s["accuracy_vs_eagle3"]["points"] == pytest.approx(-2.5) and s["accuracy_vs_eagle3"]["n"] == 40
    assert "accuracy_vs_eagle3" not in e
    assert d["sweeps"]["budget"][0]["accuracy_vs_eagle3"]["ci95"] == [0.0, 0.0]
    chk = target_checks(d["methods"])["accuracy_within_1_point_of_eagle3"]
    assert chk["value"] == pytest.approx(2.5) and not chk["pass"] and chk["ci95_points"][0] < -1
    # the speed-up over EAGLE-3, paired on the 10 timed problems (every one 2.5x here: no spread)
    assert s["speedup_vs_eagle3"]["ratio"] == pytest.approx(2.5) and s["speedup_vs_eagle3"]["n"] == 10
    assert d["methods"]["deer"]["speedup_vs_eagle3"]["ratio"] == pytest.approx(2.0)  # untimed 9.0s left out
    sp = target_checks(d["methods"])["speedup_vs_eagle3"]
    assert sp["value"] == pytest.approx(2.5) and sp["ci95"] == pytest.approx([2.5, 2.5])
    from pipelines.report.job import method_table

    (line,) = [x for x in method_table(d) if x.startswith("| specexit |")]
    assert "| 2.50 [2.50, 2.50] |" in line  # the report's speed-up column carries the interval


def test_effort_rows_are_a_sweep_least_thinking_first_with_their_table():
    from pipelines.report.job import effort_table

    rows = []
    for i in range(20):
        rows.append(_row(f"p{i}", "eagle3", True, 1.0))
        for level, think, ok in (("max", 90, True), ("low", 30, i != 0), ("high", 40, True)):
            r = _row(f"p{i}", "effort", ok, 0.5, setting=level)
            r["think_tokens"] = think
            rows.append(r)
    d = aggregate(rows, tolerance=0.01)["0"]
    levels = d["sweeps"]["effort"]
    assert [p["setting"] for p in levels] == ["low", "high", "max"] and "effort" not in d["methods"]
    assert levels[0]["accuracy_vs_eagle3"]["points"] == pytest.approx(-5.0) and levels[0]["think_tokens"] == 30
    assert levels[0]["speedup_vs_eagle3"]["ratio"] == pytest.approx(2.0)
    table = effort_table(levels, 1.0)
    assert table[4].startswith("| low | 95.0% |") and table[-1].startswith("| max | 100.0% |")
