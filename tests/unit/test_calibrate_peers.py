"""The peers' dev-split calibration (pipelines/calibrate/peers.py), the lockstep driver of the
multi-request methods, and how an evaluation takes the calibrated peer settings."""

from __future__ import annotations

import json

import pytest

from pipelines.calibrate.peers import (
    calibrate_budget,
    calibrate_deer,
    calibrate_dynasor,
    deer_exit,
    dynasor_exit,
    paper_every,
    reference_dynasor_exit,
)
from pipelines.evaluate.config import EvalConfig
from pipelines.evaluate.job import aggregate
from pipelines.evaluate.methods import Ids, Out, drive, drive_lockstep, dynasor
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.typed_config import ConfigError, load_config
from support.eval_rows import eval_row

HEDGES = ["wait", "hold", "but", "okay", "no", "hmm"]


def _dyn_points(answers: list[str | None], texts: list[str] | None = None, right: str = "7") -> dict:
    """Probes at positions 0..len-1: (position, answer, text, right)."""
    texts = texts or [f"The answer is {a} ." for a in answers]
    return {p: [p, a, t, a == right] for p, (a, t) in enumerate(zip(answers, texts))}


def test_deer_exit_takes_the_first_transition_above_the_threshold_by_the_chosen_mean():
    pts = [[10, 0.5, 0.4, False], [20, 0.97, 0.90, True], [30, 0.99, 0.99, True]]
    assert deer_exit(pts, 0.95, "arithmetic") == (20, True)
    assert deer_exit(pts, 0.95, "geometric") == (30, True)
    assert deer_exit(pts, 0.995, "arithmetic") is None


def test_dynasor_exit_needs_window_agreeing_unhedged_answers_at_its_interval():
    pts = _dyn_points(["1", "5", "7", "7", "7", "7", "7", "7", "7"])
    assert dynasor_exit(pts, 8, every=1, window=3, hedge_words=HEDGES) == (4, True)  # answers at 2, 3, 4
    assert dynasor_exit(pts, 8, every=2, window=2, hedge_words=HEDGES) == (4, True)  # at 2 and 4
    assert dynasor_exit(pts, 3, every=1, window=3, hedge_words=HEDGES) is None  # thinking ended at 3
    hedged = _dyn_points(["7"] * 6, ["7"] * 3 + ["hmm 7"] + ["7"] * 2)
    assert dynasor_exit(hedged, 5, every=1, window=3, hedge_words=HEDGES) is None


def test_reference_rule_probes_before_each_chunk_and_matches_hedges_as_substrings():
    pts = _dyn_points(["1", "5", "7", "7", "7", "7", "7", "7", "7"])
    # probes at 2, 3, 4 agree after the chunk that ends at 5: exit at 5 with the probe at 4
    assert reference_dynasor_exit(pts, 8, every=1, window=3, hedge_words=HEDGES) == (5, True)
    # "nothing" contains "no": the reference counts it as a hedge, our whole-word rule does not
    texts = ["The answer is 7 , nothing else ."] * 6
    pts = _dyn_points(["7"] * 6, texts)
    assert dynasor_exit(pts, 5, every=1, window=2, hedge_words=HEDGES) == (2, True)
    assert reference_dynasor_exit(pts, 5, every=1, window=2, hedge_words=HEDGES) is None
    # an empty answer never counts, in either rule
    pts = _dyn_points([None, None, None, None])
    assert reference_dynasor_exit(pts, 3, every=1, window=2, hedge_words=HEDGES) is None


def _trace(answers, end, correct=True):
    return {"correct": correct, "think_tokens": end, "think_end": end, "dynasor_points": _dyn_points(answers)}


def test_calibrated_dynasor_is_the_cheapest_setting_within_tolerance_and_edges_are_reported():
    # 4 traces: the answer settles at 3; a window of 2 at every token exits on the early wrong pair
    tr = [_trace(["1", "4", "4", "7", "7", "7", "7", "7", "7", "7", "7"], 10) for _ in range(4)]
    out = calibrate_dynasor(tr, [1, 2, 4], [2, 3], HEDGES, ref_accuracy=1.0, tolerance=0.0)
    assert dynasor_exit(tr[0]["dynasor_points"], 10, every=1, window=2, hedge_words=HEDGES) == (2, False)
    assert out["within_tolerance"] and out["replay"]["accuracy"] == 1.0
    assert out["setting"] == {"every": 1, "window": 3} and out["replay"]["think_tokens"] == 5
    # every = 1 cannot go lower (not an edge to widen); window 3 is the grid's highest
    assert out["at_grid_edge"] == ["window = 3 is the highest value of the grid [2, 3]"]
    assert out["paper_every"] == 1  # 1% of 10 tokens
    cc = out["cross_check"]
    assert cc["ours"]["think_tokens"] == 5 and cc["reference_rule"]["think_tokens"] == 6
    assert cc["same_decision_share"] == 1.0  # both decide on the probe at 5; the reference exits at 6


def test_calibrated_deer_and_budget_respect_the_tolerance():
    tr = [{"correct": True, "think_tokens": 50, "deer_points": [[10, 0.99, 0.9, False], [30, 0.999, 0.99, True]]}] * 3
    out = calibrate_deer(tr, [0.9, 0.995], ["arithmetic", "geometric"], ref_accuracy=1.0, tolerance=0.0)
    assert out["setting"] in ({"threshold": 0.995, "mean": "arithmetic"}, {"threshold": 0.9, "mean": "geometric"})
    assert out["replay"] == {"accuracy": 1.0, "think_tokens": 30}
    # budgets: forced answers below each trace's 50 think tokens; 64 keeps the whole trace
    tr = [{"correct": True, "think_tokens": 50, "budget_points": {16: i < 2, 32: True}} for i in range(4)]
    b = calibrate_budget(tr, [16, 32, 64], ref_accuracy=1.0, tolerance=0.01)
    assert b["setting"] == {"budget": 32} and b["replay"] == {"accuracy": 1.0, "think_tokens": 32}
    assert b["at_grid_edge"] == []


def test_paper_granularity():
    assert paper_every(89) == 1 and paper_every(3500) == 32 and paper_every(10) == 1


class _Gen:
    """Answers a probe with `The answer is 7 .`, any other request with `n` copies of token 5."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []
        self.answer = tok.encode(" 7 .", add_special_tokens=False)
        self.word = tok.encode(" 3", add_special_tokens=False)[0]

    def params(self, **kw):
        return kw

    def many(self, prompts, sp):
        self.calls.append(len(prompts))
        sps = sp if isinstance(sp, list) else [sp] * len(prompts)
        return [
            Out(list(self.answer), "", [], "stop", None)
            if p[-1] == self.probe_end
            else Out([self.word] * s["max_tokens"], "", [], "length", None)
            for p, s in zip(prompts, sps)
        ]

    def one(self, prompt, **kw):
        return self.many([prompt], self.params(**kw))[0]


def test_lockstep_runs_the_same_requests_as_one_at_a_time_in_fewer_generates():
    from transformers import AutoTokenizer

    from pipelines.common.graders import EXTRACTORS

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    probe = enc("</think>\n\nThe answer is")
    ids = Ids(enc("<think>")[0], enc("</think>")[0], (), (), [], [], [], [], probe)
    cfg = EvalConfig(output="x", engine={"model": str(TEACHER_DIR)}, draft="unused").dynasor.model_copy(
        update={"every": 4, "window": 3}
    )

    def methods():
        return [
            dynasor(
                ids,
                enc(f"Compute {i}"),
                cfg,
                max_tokens=100,
                temperature=0.0,
                seed=None,
                extract=EXTRACTORS["toy"],
                decode=lambda t: tok.decode(t),
            )
            for i in range(5)
        ]

    g1, g2 = _Gen(tok), _Gen(tok)
    g1.probe_end = g2.probe_end = probe[-1]
    one = [drive(g1, m) for m in methods()]
    many = drive_lockstep(g2, methods())
    assert [r.completion for r in one] == [r.completion for r in many]
    assert all(r.info["exit_index"] == 12 for r in many)  # probes at 4, 8, 12 agree
    # per problem: the first chunk, then (probe, next chunk) together, three times
    assert sum(g1.calls) == sum(g2.calls) == 5 * 7 and len(g1.calls) == 5 * 4 and len(g2.calls) == 4
    assert all(r.requests == 7 for r in many)


def test_an_evaluation_takes_the_peer_settings_from_the_calibrated_file(tmp_path):
    cal = tmp_path / "calibrated.json"
    cal.write_text(
        json.dumps(
            {
                "exit": {"method": "confidence", "confidence_threshold": 0.5},
                "peers": {
                    "deer": {"threshold": 0.8, "mean": "geometric"},
                    "dynasor": {"every": 2, "window": 4},
                    "budget": 40,
                },
            }
        )
    )
    base = dict(output=str(tmp_path / "o"), engine={"model": str(TEACHER_DIR)}, draft="unused", budget_sweep=[32, 64])
    cfg = EvalConfig(**base, calibrated=str(cal)).with_calibrated_peers()
    assert (cfg.deer.threshold, cfg.deer.mean, cfg.dynasor.every, cfg.dynasor.window) == (0.8, "geometric", 2, 4)
    assert cfg.budget_chosen == 40 and cfg.budget_sweep == [32, 40, 64]
    assert EvalConfig(**base).with_calibrated_peers().budget_chosen is None
    cal.write_text(json.dumps({"exit": {}, "peers": {"dynasor": {"evry": 2}}}))
    with pytest.raises(ValueError, match="evry"):
        EvalConfig(**base, calibrated=str(cal)).with_calibrated_peers()
    with pytest.raises(ConfigError, match="budget_chosen"):
        load_config(EvalConfig, raw={**base, "budget_chosen": 40})


def test_the_budget_row_is_the_dev_choice_when_there_is_one():
    rows = []
    for i in range(4):
        rows.append(eval_row(f"p{i}", "eagle3", True, think=90))
        rows.append(eval_row(f"p{i}", "budget", i < 3, think=16, setting="16"))
        rows.append(eval_row(f"p{i}", "budget", True, think=60, setting="64"))
    assert aggregate(rows, tolerance=0.01)["0"]["methods"]["budget"]["chosen_on"] == "this run"
    b = aggregate(rows, tolerance=0.01, budget_chosen=16)["0"]["methods"]["budget"]
    assert b["setting"] == 16 and b["chosen_on"] == "dev" and b["accuracy"] == 0.75


def test_the_exit_must_hold_at_every_calibration_temperature():
    from pipelines.calibrate.job import choose_exit

    greedy = [
        {"accuracy": 0.9, "think_tokens": 20},
        {"accuracy": 0.9, "think_tokens": 30},
        {"accuracy": 0.9, "think_tokens": 80},
    ]
    sampled = [
        {"accuracy": 0.80, "think_tokens": 22},
        {"accuracy": 0.88, "think_tokens": 31},
        {"accuracy": 0.9, "think_tokens": 78},
    ]
    ref = {0.0: 0.9, 0.6: 0.89}
    assert choose_exit({0.0: greedy}, {0.0: 0.9}, 0.01) == 0  # greedy alone: the cheapest
    assert choose_exit({0.0: greedy, 0.6: sampled}, ref, 0.01) == 1  # 0 loses 9 points when sampled
    assert choose_exit({0.0: greedy, 0.6: sampled}, ref, 0.0) == 2
    with pytest.raises(ValueError, match="start with 0.0"):
        from pipelines.calibrate.config import CalibrateConfig

        CalibrateConfig(output="x", eval={"output": "y", "engine": {"model": "m"}, "draft": "d"}, temperatures=[0.6])
