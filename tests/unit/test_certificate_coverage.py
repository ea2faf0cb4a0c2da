"""studies/certificate_coverage.py's analysis on a synthetic pool with known losses: the certified
choice keeps the pool loss within epsilon in at least 1 - delta of the calibration sets, the
point-estimate rule does not, and every split is recorded."""

from __future__ import annotations

from types import SimpleNamespace

from specexit_core.exit import ExitConfig
from support.paths import load_script


def test_the_certified_choice_covers_where_the_point_estimate_does_not(tmp_path):
    mod = load_script("studies/certificate_coverage.py")
    n = 400
    traces = [{"id": f"p{i}", "think_tokens": 90, "oracle_think": 30} for i in range(n)]
    # three settings, conservative to aggressive: pool losses 0, 1% and 6% (epsilon 5%), think 80 / 40 / 10
    settings = [ExitConfig(confidence_threshold=c) for c in (0.9, 0.5, 0.1)]
    lost = [set(), {f"p{i}" for i in range(0, n, 100)}, {f"p{i}" for i in range(0, n, 17)}]
    losses = [{t["id"]: float(t["id"] in lost[s]) for t in traces} for s in range(3)]
    think = [{t["id"]: (80, 40, 10)[s] for t in traces} for s in range(3)]
    args = SimpleNamespace(seed=0, splits=60, subset=120, epsilon=0.05, delta=0.1, temperature=0.6)
    res = mod.study(traces, settings, losses, think, args)
    assert len(res["by_split"]) == 60 and res["pool_problems"] == n and res["grid_size"] == 3
    assert res["coverage"] >= 0.9 and res["holds"]
    assert res["point_estimate"]["exceed_share"] > 1 - res["coverage"]  # lucky sets pick the 6% setting
    assert res["pool"]["best_within_epsilon_think_tokens"] == 40
    for sp in res["by_split"]:
        assert (sp["certified"] is None) == (sp["bound"] is None)
        if sp["certified"] is not None:
            assert sp["pool_loss"] in (0.0, 0.01) or sp["pool_loss"] > 0.05
    mod.plot(res, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
