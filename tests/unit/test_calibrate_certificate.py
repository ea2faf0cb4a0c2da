"""The certified exit in `specexit calibrate` (pipelines/calibrate/certificate.py): per-prompt losses
from the replay, the certificate's record, and which setting `selection` writes. The calibration job
runs for real (engine, replay, certificate recorded) as stage 4 of the toy demo
(tests/integration/test_demo.py); here its replay is replaced by fixed outcomes, so that the choice
between the rules is checked where it differs."""

from __future__ import annotations

import pytest

from pipelines.calibrate import job
from pipelines.calibrate.certificate import certified_choice, prompt_losses
from pipelines.calibrate.config import CalibrateConfig
from specexit_core.exit import ExitConfig

N = 400


def _traces(n=N):
    return [
        {"id": f"p{i}", "correct": True, "think_tokens": 100, "oracle_think": 40, "answers": {}, "final_answer": "7"}
        for i in range(n)
    ]


def _outcomes(n=N):
    """Three settings, conservative to aggressive: never wrong (90 think tokens), wrong on 0.5% of
    the prompts (60), wrong on 10% (20); (right, think tokens, answer), a wrong answer "8"."""

    def res(ok, think):
        return ok, think, "7" if ok else "8"

    return [
        [res(True, 90)] * n,
        [res(i % 200 != 0, 60) for i in range(n)],
        [res(i % 10 != 0, 20) for i in range(n)],
    ]


def test_prompt_losses_are_per_prompt_and_temperature():
    tr = _traces(4)
    tr[1]["correct"] = False  # wrong at its natural end: an exit cannot make it worse
    row = [(False, 5, "8"), (False, 5, "8"), (True, 5, "7"), (True, 5, None)]
    out = prompt_losses({0.0: tr}, {0.0: [row]}, "accuracy_drop")
    assert out == {"0": [{"p0": 1.0, "p1": 0.0, "p2": 0.0, "p3": 0.0}]}
    # no gold: what counts is whether the exit's answer is the trace's own ("7"), right or wrong
    out = prompt_losses({0.0: tr}, {0.0: [row]}, "disagreement")
    assert out == {"0": [{"p0": 1.0, "p1": 1.0, "p2": 0.0, "p3": 1.0}]}


def test_a_prompts_samples_count_once_with_their_mean_loss():
    """k samples of a prompt (`EvalConfig.samples`, `load_traces` names each trace's `problem`): the
    certificate's unit is the prompt, its loss the mean over its samples."""
    tr = [
        {"id": pid if j == 0 else f"{pid}/s{j}", "problem": pid, "sample": j, "correct": True, "answers": {}}
        for pid in ("p0", "p1")
        for j in range(4)
    ]
    row = [(True, 5, "7")] * 4 + [(False, 5, "8"), (True, 5, "7"), (True, 5, "7"), (False, 5, "8")]
    for t in tr:
        t["final_answer"] = "7"
    assert prompt_losses({0.6: tr}, {0.6: [row]}, "disagreement") == {"0.6": [{"p0": 0.0, "p1": 0.5}]}
    assert prompt_losses({0.6: tr}, {0.6: [row]}, "accuracy_drop") == {"0.6": [{"p0": 0.0, "p1": 0.5}]}


def test_the_disagreement_loss_refuses_traces_without_answers():
    tr = _traces(2)
    tr[0]["answers"] = None  # an evaluation from before the probes' answers were recorded
    with pytest.raises(ValueError, match="rerun the dev evaluation"):
        prompt_losses({0.0: tr}, {0.0: [[(True, 5, "7"), (True, 5, "7")]]}, "disagreement")


def test_the_record_names_epsilon_delta_loss_sizes_and_the_bound():
    rec = certified_choice(
        {0.0: _traces()},
        {0.0: _outcomes()},
        epsilon=0.02,
        delta=0.1,
        loss="accuracy_drop",
        order_share=0.5,
        seed=0,
        point_choice=2,
    )
    assert rec["chosen"] == 1 and rec["certified"] == [0, 1] and rec["tested"] == 3
    assert rec["epsilon"] == 0.02 and rec["delta"] == 0.1 and rec["loss"] == "accuracy_drop"
    assert rec["n_dev"] == N == rec["n_order"] + rec["n_test"] and 0 < rec["bound"] < 0.02
    assert rec["observed_loss"] == pytest.approx(0.005) and rec["dev_size_for_zero_losses"] == 114
    assert rec["point_choice"] == {"observed_loss": pytest.approx(0.1), "dev_size_needed": None}  # 10% > ε


@pytest.fixture
def calibrate(monkeypatch, tmp_path):
    """run_calibration with its evaluation and replay replaced by fixed outcomes (3 settings)."""
    settings = [ExitConfig(confidence_threshold=c) for c in (0.99, 0.9, 0.5)]
    import pipelines.evaluate.job as evaluate_job

    monkeypatch.setattr(evaluate_job, "run_evaluation", lambda ev: {"methods": {}})
    monkeypatch.setattr(job, "load_traces", lambda d, t=0.0: _traces())
    monkeypatch.setattr(job, "draft_token_ids", lambda d: {})
    monkeypatch.setattr(job, "grid", lambda cfg: settings)

    def replay_outcomes(trs, ss, ids, outcome=None):
        rows = _outcomes() if len(ss) == 3 else [_outcomes()[0]]
        return rows if outcome is job.exit_result else [[r[:2] for r in row] for row in rows]

    monkeypatch.setattr(job, "replay_outcomes", replay_outcomes)

    def run(**kw):
        raw = {
            "output": str(tmp_path / "c.json"),
            "eval": {"draft": str(tmp_path), "output": str(tmp_path / "dev"), "engine": {"model": str(tmp_path)}},
            "peers": False,
            "confirm": False,
            **kw,
        }
        return job.run_calibration(CalibrateConfig.model_validate(raw))

    return run, settings


def test_selection_certified_writes_the_certified_setting_tolerance_the_point_estimate(calibrate):
    run, settings = calibrate
    point = run(tolerance=0.2, epsilon=0.02)  # the point rule: the cheapest within 20 points (10% loss)
    assert point["exit"] == settings[2].to_dict() and point["calibration"]["selection"] == "tolerance"
    assert point["calibration"]["certificate"]["chosen"] == settings[1].to_dict()  # recorded beside it
    cert = run(tolerance=0.2, selection="certified", epsilon=0.02)
    assert cert["exit"] == settings[1].to_dict() and cert["calibration"]["chosen_replay"]["think_tokens"] == 60


def test_nothing_certified_turns_the_exit_off(calibrate):
    run, _ = calibrate
    out = run(selection="certified")  # ε = 1%: 200 test prompts cannot show it (0.99^200 = 0.13 > δ)
    assert out["exit"]["enabled"] is False and out["calibration"]["certificate"]["chosen"] is None
    assert out["calibration"]["chosen_replay"] == {"accuracy": 1.0, "think_tokens": 100}  # EAGLE-3's


def test_a_profile_its_own_test_leaves_uncertified_falls_back_to_the_joint_exit(monkeypatch):
    """Certified selection: a profile whose own traces certify nothing gets the joint certified exit
    (tested at every profile), marked `source: joint`; with no joint exit either, the exit is off."""
    from pipelines.evaluate.config import EvalConfig

    settings = [ExitConfig(confidence_threshold=c) for c in (0.99, 0.9, 0.5)]
    cfg = CalibrateConfig(
        output="x.json", selection="certified", eval={"output": "o", "engine": {"model": "m"}, "draft": "d"}
    )
    ev = EvalConfig(output="o", engine={"model": "m"}, draft="d")
    nothing = {"chosen": None, "bound": None, "epsilon": 0.01, "delta": 0.1, "loss": "disagreement", "n_dev": 4}
    monkeypatch.setattr(job, "certified_choice", lambda *a, **kw: dict(nothing))
    traces = {0.0: _traces(4)}
    points = {0.0: [{"accuracy": 1.0, "think_tokens": x} for x in (90, 60, 20)]}
    args = (cfg, ev, job.DevReplay(settings, traces, {0.0: _outcomes(4)}, points, {0.0: 1.0}))
    fell_back = job.choose_per_profile(*args, joint=1)["T0"]
    assert fell_back["source"] == "joint" and fell_back["exit"] == settings[1].to_dict()
    assert fell_back["replay"]["think_tokens"] == 60 and fell_back["certificate"]["chosen"] is None
    off = job.choose_per_profile(*args, joint=None)["T0"]
    assert off["source"] == "off" and off["exit"]["enabled"] is False


def test_each_effort_level_is_certified_at_its_own_epsilon(calibrate):
    """`efforts`: Learn then Test once per level over the same replay; a lower effort, allowed more loss,
    certifies a cheaper setting; a level whose epsilon the dev split cannot show keeps the exit off."""
    run, settings = calibrate
    out = run(efforts={"minimal": 0.2, "low": 0.05, "high": 0.01})
    e = out["efforts"]
    assert [e[k]["epsilon"] for k in ("minimal", "low", "high")] == [0.2, 0.05, 0.01]
    assert e["minimal"]["exit"] == settings[2].to_dict() and e["low"]["exit"] == settings[1].to_dict()
    assert e["high"]["exit"]["enabled"] is False  # 200 test prompts cannot show 1 point
    assert set(e["low"]["by_profile"]) == {"T0"}  # the calibration temperatures (here greedy only)
    ev = out["calibration"]["efforts"]
    assert ev["low"]["certificate"]["bound"] <= 0.05 and ev["high"]["certificate"]["chosen"] is None
    from specexit_core.exit.profiles import parse_profiles

    assert [lv for lv, _, _ in parse_profiles(out).efforts] == ["minimal", "low", "high"]  # what servers read
    assert "efforts" not in run(efforts=None)
