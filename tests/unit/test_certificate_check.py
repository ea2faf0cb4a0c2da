"""The certified exit checked on the evaluation's own (new) problems: the certificate that speaks for
each temperature (its profile's, else the joint one) against the loss measured between specexit and
eagle3 on every problem-sample (pipelines/evaluate/certificate_check.py)."""

from __future__ import annotations

import json

import pytest

from pipelines.common.graders import EXTRACTORS
from pipelines.evaluate.certificate_check import certificate_check, certificates_by_temperature, measured_losses
from support.eval_rows import eval_row

EXTRACT = EXTRACTORS["toy"]


def _rows(t, answers, correct=None):
    """specexit and eagle3 rows at temperature `t`; `answers`: {(pid, sample): (specexit's, eagle3's)}."""
    out = []
    for (pid, j), (s, e) in answers.items():
        for m, a in (("specexit", s), ("eagle3", e)):
            r = eval_row(pid, m, correct is None or correct[(pid, j)][m], info={"sample": j} if j else {})
            r.update(temperature=t, completion_text=f"x </think> The answer is {a} .")
            out.append(r)
    return out


def _calibrated(tmp_path, joint_bound=0.004, profile_bound=0.02):
    cert = lambda b: {"epsilon": 0.05, "delta": 0.1, "loss": "disagreement", "bound": b, "n_dev": 300}  # noqa: E731
    f = tmp_path / "calibrated.json"
    by = {"T0.6-p0.95": {"certificate": cert(profile_bound)}}
    f.write_text(json.dumps({"exit": {}, "calibration": {"certificate": cert(joint_bound), "by_profile": by}}))
    return f


def test_the_loss_per_problem_sample():
    answers = {("p0", 0): ("7", "7"), ("p0", 1): ("3", "7"), ("p1", 0): ("5", "5")}
    assert measured_losses(_rows(0.6, answers), "disagreement", EXTRACT) == {
        "0.6": {("p0", 0): 0.0, ("p0", 1): 1.0, ("p1", 0): 0.0}
    }
    correct = {("p0", 0): {"specexit": False, "eagle3": True}, ("p0", 1): {"specexit": False, "eagle3": False}}
    rows = _rows(0.6, {k: answers[k] for k in correct}, correct)
    # accuracy_drop: only where EAGLE-3 was right and SpecExit wrong (an exit cannot make a wrong trace worse)
    assert measured_losses(rows, "accuracy_drop", EXTRACT) == {"0.6": {("p0", 0): 1.0, ("p0", 1): 0.0}}


def test_each_temperature_is_judged_by_the_certificate_that_speaks_for_it(tmp_path):
    cal = _calibrated(tmp_path)
    got = certificates_by_temperature(cal, {"0": "T0", "0.6": "T0.6-p0.95"})
    assert got["0"]["profile"] is None and got["0"]["bound"] == 0.004  # no T0 profile: the joint exit's
    assert got["0.6"]["profile"] == "T0.6-p0.95" and got["0.6"]["bound"] == 0.02
    # a profile that fell back to the joint exit is judged by the joint certificate
    data = json.loads(cal.read_text())
    data["calibration"]["by_profile"]["T0.6-p0.95"]["source"] = "joint"
    cal.write_text(json.dumps(data))
    fell_back = certificates_by_temperature(cal, {"0.6": "T0.6-p0.95"})["0.6"]
    assert fell_back["profile"] is None and fell_back["bound"] == 0.004


def test_the_check_reports_the_test_loss_with_its_interval(tmp_path):
    cal = _calibrated(tmp_path)
    answers = {(f"p{i}", j): ("7", "7" if (i, j) != (3, 1) else "2") for i in range(40) for j in range(2)}
    rows = _rows(0.0, {k: v for k, v in answers.items() if k[1] == 0}) + _rows(0.6, answers)
    chk = certificate_check(rows, cal, {"0": "T0", "0.6": "T0.6-p0.95"}, EXTRACT)
    t0, t6 = chk["0"], chk["0.6"]
    assert (t0["test_loss"], t0["n"], t0["problems"]) == (0.0, 40, 40) and t0["holds"] is True
    assert t6["test_loss"] == pytest.approx(1 / 80) and (t6["n"], t6["problems"]) == (80, 40)
    assert t6["test_loss_ci95"][0] == 0.0 and t6["test_loss_ci95"][1] > t6["test_loss"]
    assert t6["within_epsilon"] is True and t6["epsilon"] == 0.05
    # nothing certified: nothing to judge, the loss is still measured
    none = certificate_check(rows, _calibrated(tmp_path, profile_bound=None), {"0.6": "T0.6-p0.95"}, EXTRACT)
    assert none["0.6"]["holds"] is None and none["0.6"]["test_loss"] == pytest.approx(1 / 80)


def test_the_report_section_and_its_figure(tmp_path):
    from pipelines.report.certificate import certificate_lines, plot_certificate

    cal = _calibrated(tmp_path)
    answers = {(f"p{i}", j): ("7", "7" if i else "2") for i in range(10) for j in range(2)}
    chk = certificate_check(_rows(0.6, answers), cal, {"0.6": "T0.6-p0.95"}, EXTRACT)
    plot_certificate(chk, tmp_path / "certificate.png")
    assert (tmp_path / "certificate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (row,) = [line for line in certificate_lines(chk) if line.startswith("| 0.6 |")]
    # 10% of the problem-samples disagree, above epsilon 5%: the table says so, never "holds"
    assert "| T0.6-p0.95 | disagreement | 5.00% | 0.1 | 2.00% | 10.00% [" in row and row.endswith("| 20 (10) | no |")
