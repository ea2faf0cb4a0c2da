"""Shifted toy test sets (specexit_core/toy/shifts.py), their prompt-source config, the
generalisation job's config and summary, and its report section (no Ray, no engine)."""

from __future__ import annotations

import hashlib
import json

import pytest

from pipelines.common.prompt_source import InputConfig, _toy_rows
from pipelines.evaluate.generalisation import IN_DISTRIBUTION, GeneralisationConfig, summarise
from pipelines.report.generalisation import generalisation_section, plot_generalisation, write_generalisation_report
from specexit_core.toy.shifts import LONGER_OPS, SHIFTS, shifted_problems
from specexit_core.toy.task import (
    MAX_OPERAND,
    MAX_OPS,
    MAX_VALUE,
    apply,
    grade,
    is_hard,
    parse_problem,
    problems,
)
from specexit_core.toy.tokenizer import UNK, build_tokenizer
from specexit_core.typed_config import ConfigError, load_config
from support.paths import REPO_ROOT

N = 60


def _digest(ps) -> str:
    return hashlib.sha1("|".join(p.text for p in ps).encode()).hexdigest()[:16]


def test_in_distribution_problems_are_unchanged():
    """The shifts reuse `random_problem`; its default draws (every split, every seed) stay as they were."""
    assert _digest(problems("test", 300, seed=0)) == "9db54d1e062cb920"
    assert _digest(problems("dev", 300, seed=0)) == "0b8f2815518dc8ae"
    assert _digest(problems("train", 300, seed=0)) == "30ce1f124dcc75d7"
    assert _digest(problems("test", 300, seed=1234)) == "cc902ef45ad5a3b3"


@pytest.mark.parametrize("shift", SHIFTS)
def test_shifted_sets_are_deterministic_valid_and_gradable(shift):
    a, b = shifted_problems(shift, "test", N), shifted_problems(shift, "test", N)
    assert a == b
    assert shifted_problems(shift, "test", N, seed=1) != a
    assert len({q.uid for q in a}) == N
    tok = build_tokenizer()
    unk = tok.convert_tokens_to_ids(UNK)
    for q in a:
        p = q.problem
        assert p.split == "test"
        assert all(0 <= v <= MAX_VALUE for v in p.values())  # every number stays one token
        assert unk not in tok(q.prompt, add_special_tokens=False)["input_ids"], q.prompt
        assert parse_problem(q.prompt) == p  # traces read back from files are graded on the same problem
        assert grade(f"<think>\n1 + 1 = 2\n\n</think>\n\nThe answer is {q.answer} .", q.answer)
        assert not grade(f"</think>\n\nThe answer is {q.answer + 1} .", q.answer)


def test_longer_chains_are_longer_than_training():
    train_max = max(len(p.steps) for p in problems("train", 2000))
    assert train_max == MAX_OPS
    lens = [len(q.problem.steps) for q in shifted_problems("longer_chains", "test", N)]
    assert min(lens) > train_max and max(lens) <= LONGER_OPS[1]
    assert len(set(lens)) > 1


def test_in_support_shifts_reweight_training():
    assert {len(q.problem.steps) for q in shifted_problems("longest_seen", "test", N)} == {MAX_OPS}
    for q in shifted_problems("hard_steps", "test", N):
        p = q.problem
        assert all(is_hard(a, op, b) for a, (op, b) in zip(p.values(), p.steps))


def test_operator_and_operand_shifts():
    train_ops = {op for p in problems("train", 2000) for op, _ in p.steps}
    assert "/" not in train_ops
    for q in shifted_problems("division", "test", N):
        steps = q.problem.steps
        assert any(op == "/" for op, _ in steps)
        vals = q.problem.values()
        for a, (op, b) in zip(vals, steps):
            if op == "/":
                assert b >= 2 and a % b == 0 and apply(a, op, b) * b == a  # exact: an integer answer
    big = [b for q in shifted_problems("large_operands", "test", N) for op, b in q.problem.steps if op in "+-"]
    assert max(b for p in problems("train", 2000) for op, b in p.steps if op in "+-") <= MAX_OPERAND
    assert all(b > MAX_OPERAND for b in big) and big


def test_phrasing_asks_the_same_problems_another_way():
    for q in shifted_problems("phrasing", "test", N):
        assert q.prompt != q.problem.prompt and q.prompt.startswith("Compute : ")


def test_unknown_shift_is_an_error():
    with pytest.raises(ValueError, match="unknown toy shift"):
        shifted_problems("sideways", "test", 1)


# -- the prompt source -------------------------------------------------------------------------------


def test_input_config_shift_validation():
    assert InputConfig(kind="toy", split="test", shift="division").shift == "division"
    with pytest.raises(ValueError, match="shift"):
        InputConfig(kind="toy", split="test", shift="sideways")
    with pytest.raises(ValueError, match="toy test set"):
        InputConfig(kind="jsonl", path="x.jsonl", shift="division")
    with pytest.raises(ValueError, match="toy split"):
        InputConfig(kind="toy", split="validation", shift="division")


def test_no_shift_keeps_the_old_dump():
    """Run identities (run.json) of outputs written before `shift` existed still match."""
    assert "shift" not in InputConfig(kind="toy").model_dump()
    assert InputConfig(kind="toy", shift="phrasing").model_dump()["shift"] == "phrasing"
    assert json.loads(InputConfig(kind="toy", shift="phrasing").model_dump_json())["shift"] == "phrasing"


def test_toy_rows_of_a_shift():
    plain = _toy_rows(InputConfig(kind="toy", split="test", n=5), 5)
    assert [r["prompt"] for r in plain] == [p.prompt for p in problems("test", 5)]
    assert all(r["id"].startswith("toy-test-") and "phrasing" not in r["id"] for r in plain)
    rows = _toy_rows(InputConfig(kind="toy", split="test", n=5, shift="phrasing"), 5)
    qs = shifted_problems("phrasing", "test", 5)
    assert [r["prompt"] for r in rows] == [q.prompt for q in qs]
    assert [r["gold"] for r in rows] == [str(q.answer) for q in qs]
    assert all(r["id"].startswith("toy-test-phrasing-") for r in rows)


# -- the generalisation job's config -----------------------------------------------------------------

EXAMPLE = REPO_ROOT / "examples" / "toy" / "generalisation.yaml"


def _raw(**eval_updates) -> dict:
    import yaml

    d = yaml.safe_load(EXAMPLE.read_text())
    d["eval"].update(eval_updates)
    return d


def test_example_config_loads_one_evaluation_per_distribution():
    cfg = load_config(GeneralisationConfig, EXAMPLE)
    ds = cfg.distributions()
    assert list(ds) == [IN_DISTRIBUTION, *cfg.shifts]
    assert set(cfg.shifts) == set(SHIFTS)
    assert ds[IN_DISTRIBUTION].input.shift is None
    assert {n: e.input.shift for n, e in ds.items() if n != IN_DISTRIBUTION} == {s: s for s in cfg.shifts}
    assert [e.output for e in ds.values()] == [f"{cfg.output}/{n}" for n in ds]
    assert all(e.calibrated and e.calibrated.endswith("examples/toy/calibrated.json") for e in ds.values())
    assert cfg.eval.input.shift is None  # the copies did not change the base


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"calibrated": None}, "calibrated"),
        ({"input": {"kind": "toy", "split": "test", "n": 4, "shift": "division"}}, "in-distribution"),
        ({"methods": ["specexit", "oracle"]}, "eagle3"),
    ],
)
def test_generalisation_config_refuses(change, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GeneralisationConfig, raw=_raw(**change))


def test_generalisation_config_refuses_bad_shifts():
    for shifts in ([], ["division", "division"], ["sideways"]):
        with pytest.raises(ConfigError):
            load_config(GeneralisationConfig, raw={**_raw(), "shifts": shifts})
    with pytest.raises(ConfigError, match="extra"):
        load_config(GeneralisationConfig, raw={**_raw(), "shift": ["division"]})


# -- the summary and the report section --------------------------------------------------------------


def _m(acc, think, vs=None, n=40):
    return {
        "n": n,
        "accuracy": acc,
        "accuracy_ci95": [acc - 0.05, min(1.0, acc + 0.05)],
        "accuracy_vs_eagle3": vs,
        "think_tokens": think,
        "latency_s": 0.1,
    }


def _eval_summary(e_acc, e_think, s_acc, s_think, s_vs):
    return {
        "n": 40,
        "errors": 0,
        "methods": {
            "eagle3": _m(e_acc, e_think),
            "specexit": _m(s_acc, s_think, {"points": s_vs, "ci95": [s_vs - 3, s_vs + 3], "n": 40}),
            "plain": {"n": 0, "errors": 40},  # a method with no ok row is left out
        },
    }


SYNTH = {
    IN_DISTRIBUTION: _eval_summary(0.9, 100.0, 0.9, 40.0, 0.0),
    "longer_chains": _eval_summary(0.1, 120.0, 0.05, 90.0, -5.0),
}


def test_summarise_savings_and_moves():
    g = summarise(SYNTH)
    assert g["in_distribution"] == IN_DISTRIBUTION
    d0, d1 = g["distributions"][IN_DISTRIBUTION], g["distributions"]["longer_chains"]
    assert "plain" not in d0["methods"]
    assert d0["methods"]["specexit"]["think_saving_vs_eagle3"] == pytest.approx(0.6)
    assert d1["methods"]["specexit"]["think_saving_vs_eagle3"] == pytest.approx(0.25)
    assert d0["methods"]["eagle3"]["think_saving_vs_eagle3"] == pytest.approx(0.0)
    mv = d1["methods"]["specexit"]["moved_from_in_distribution"]
    assert mv["accuracy_points"] == pytest.approx(-85.0)
    assert mv["vs_eagle3_points"] == pytest.approx(-5.0)
    assert mv["think_tokens"] == pytest.approx(50.0)
    assert mv["saving_points"] == pytest.approx(-35.0)
    assert "moved_from_in_distribution" not in d0["methods"]["specexit"]
    assert d1["methods"]["eagle3"]["moved_from_in_distribution"]["vs_eagle3_points"] is None


def test_report_section_tables(tmp_path):
    g = {**summarise(SYNTH), "specexit_exit": {"method": "confidence"}, "temperature": 0.0}
    md = "\n".join(generalisation_section(g, plot="generalisation.png"))
    assert "## Does the exit generalise?" in md
    assert "### longer_chains (40 problems)" in md
    assert "| specexit | 90.0% | [85.0, 95.0] | +0.0 [-3.0, 3.0] | 40.0 | 60% | 40 |" in md
    assert "| specexit | 5.0% | [0.0, 10.0] | -5.0 [-8.0, -2.0] | 90.0 | 25% | 40 |" in md
    assert "| eagle3 | 90.0% | [85.0, 95.0] | - | 100.0 | - | 40 |" in md
    assert "| longer_chains | specexit | -85.0 | -5.0 | +50.0 | -35 |" in md
    assert "![accuracy vs think tokens per distribution](generalisation.png)" in md
    (tmp_path / "_generalisation.json").write_text(json.dumps(g))
    report = write_generalisation_report(tmp_path)
    assert "Does the exit generalise?" in report.read_text()
    assert report.parent == tmp_path / "_report"  # beside the Parquet, not among it (meta_files.py)
    png = tmp_path / "_report" / "generalisation.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_generalisation(summarise({IN_DISTRIBUTION: SYNTH[IN_DISTRIBUTION]}), tmp_path / "one.png")
    assert (tmp_path / "one.png").stat().st_size > 0
