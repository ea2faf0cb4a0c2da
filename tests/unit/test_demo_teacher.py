"""`specexit demo --teacher NAME`: which recipe runs (no Ray, no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specexit_app.cli import build_parser
from specexit_app.demo_config import DEFAULT_CONFIG, STAGE_FILES, demo_config_path, demo_teachers, load_demo_config
from specexit_core.typed_config import ConfigError
from support.paths import REPO_ROOT


def test_toy_stays_the_default():
    assert build_parser().parse_args(["demo"]).teacher == "toy"
    assert demo_config_path() == demo_config_path("toy") == DEFAULT_CONFIG == REPO_ROOT / "examples/toy/demo.yaml"
    cfg = load_demo_config()
    assert cfg.teacher == "toy" and cfg.traces == str(REPO_ROOT / "examples/toy/traces.yaml")


def test_every_demo_teacher_has_a_recipe_of_its_own():
    choices = demo_teachers()
    assert choices[0] == "toy" and {"qwen3-like", "r1-llama-like"} <= set(choices)
    for name in choices[1:]:
        path = demo_config_path(name)
        assert path == REPO_ROOT / "examples" / name.replace("-", "_") / "demo.yaml" and path.exists()
        for quick in (False, True):
            cfg = load_demo_config(teacher=name, quick=quick)
            assert cfg.teacher == name and cfg.init_draft == "scratch"  # the toy's draft has another vocab
            assert all(str(path.parent) in getattr(cfg, s) for s in ("traces", "labels", "train_draft", "evaluate"))
            assert Path(cfg.workdir) != Path(load_demo_config(quick=quick).workdir)  # never the toy's folder


@pytest.mark.parametrize("teacher", ["qwen3-like", "r1-llama-like"])
def test_teacher_quick_is_as_small_as_the_toys(teacher):
    """CI runs every quick demo: a teacher's is no bigger than the toy's (its model costs more per token)."""
    q, toy = load_demo_config(teacher=teacher, quick=True), load_demo_config(quick=True)
    for k in ("problems", "train_steps", "calibrate_problems", "serve_requests", "eval_problems"):
        assert 1 <= getattr(q, k) <= getattr(toy, k), k
    assert q.temperatures == toy.temperatures


def test_r1_llama_like_recipe_mirrors_qwen3_likes():
    """The r1-llama-like demo is qwen3-like's (same sizes, same quick block) on another teacher: every
    stage names it, its parser is deepseek_r1, its outputs never share qwen3-like's folders. One
    difference on purpose: qwen3-like's quick run evaluates on one engine actor, r1-llama-like's on the
    recipe's two (the actor pool with real engines stays covered in CI)."""
    from specexit_core.teachers import r1_llama_like as r1
    from specexit_core.typed_config import read_yaml

    for quick in (False, True):
        r, q = (
            load_demo_config(teacher="r1-llama-like", quick=quick),
            load_demo_config(teacher="qwen3-like", quick=quick),
        )
        same = set(type(r).model_fields) - {"teacher", "workdir", "quick", "eval_concurrency", *STAGE_FILES}
        assert {k: getattr(r, k) for k in same} == {k: getattr(q, k) for k in same}
        assert (q.eval_concurrency, r.eval_concurrency) == ((1, None) if quick else (None, None))
        assert r.workdir != q.workdir and "r1-llama-like" in r.workdir
    r = load_demo_config(teacher="r1-llama-like")
    for stage in ("traces", "labels", "evaluate"):
        assert read_yaml(getattr(r, stage))["engine"]["model"] == "teacher:r1-llama-like"
    assert read_yaml(r.train_draft)["target"] == "teacher:r1-llama-like"
    model = read_yaml(r.serve)["applications"][0]["args"]["model"]
    assert model["source"] == "teacher:r1-llama-like" and model["reasoning_parser"] == r1.REASONING_PARSER
    for stage in STAGE_FILES:  # standalone outputs under runs/r1_llama_like/, not qwen3-like's
        assert "qwen3" not in json.dumps(read_yaml(getattr(r, stage))), stage


@pytest.mark.parametrize("teacher", ["qwen3-like", "r1-llama-like"])
def test_config_wins_over_teacher(teacher):
    cfg = load_demo_config(DEFAULT_CONFIG, teacher=teacher)
    assert cfg.teacher == "toy"


def test_r1_llama_like_is_a_demo_choice():
    args = build_parser().parse_args(["demo", "--teacher", "r1-llama-like", "--quick"])
    assert args.teacher == "r1-llama-like"
    cfg = load_demo_config(teacher=args.teacher, quick=True)
    assert cfg.teacher == "r1-llama-like" and cfg.traces == str(REPO_ROOT / "examples/r1_llama_like/traces.yaml")


def test_unknown_teacher_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # cmd_demo sets it; restored after
    choices = "toy, qwen3-like, r1-llama-like"
    with pytest.raises(ConfigError, match=rf"unknown teacher 'nope' for the demo; choose one of: {choices}"):
        load_demo_config(teacher="nope")
    args = build_parser().parse_args(["demo", "--teacher", "nope"])
    assert args.func(args) == 2  # before Ray or any engine starts
    assert f"choose one of: {choices}" in capsys.readouterr().err


@pytest.mark.parametrize("teacher, budget", [("toy", 400), ("qwen3-like", 700), ("r1-llama-like", 700)])
def test_endpoint_requests_get_the_evaluation_stage_budget(teacher, budget, monkeypatch, tmp_path):
    """The Serve stage's requests must hold the teacher's whole thinking: their max_tokens is the
    evaluation config's (qwen3-like thinks ~4x longer than the toy; 400 tokens cut it short)."""
    import specexit_app.demo_serve as demo_serve
    from specexit_app.demo import Stages

    seen = {}
    monkeypatch.setattr(demo_serve, "serve_and_query", lambda *a, **kw: seen.update(kw) or {})
    Stages(load_demo_config(teacher=teacher, workdir=str(tmp_path))).serve()
    assert seen["max_tokens"] == budget


@pytest.mark.parametrize("teacher", ["toy", "qwen3-like", "r1-llama-like"])
@pytest.mark.parametrize("quick", [False, True])
def test_calibration_and_evaluation_get_the_demo_sizes(teacher, quick, monkeypatch, tmp_path):
    """The calibration runs at the demo's temperatures (the quick run's [0.0] halves its dev run), the
    quick runs of the built-in teachers skip the peers' choice, and `eval_latency_problems` and
    `eval_budget_sweep` reach the evaluation;
    unset, each stage keeps its recipe's value."""
    import pipelines.calibrate.job as calibrate_job
    import pipelines.evaluate.job as evaluate_job
    import pipelines.report.job as report_job
    from specexit_app.demo import Stages
    from specexit_core.typed_config import read_yaml

    cfg = load_demo_config(teacher=teacher, quick=quick, workdir=str(tmp_path))
    seen = {}

    def calibrate(c):
        seen["calibrate"] = c
        cert = {"epsilon": 0.01, "delta": 0.1, "loss": "disagreement", "n_dev": 4, "chosen": None, "bound": None}
        calibration = {
            "eagle3": {},
            "oracle": {},
            "chosen_replay": {},
            "selection": "tolerance",
            "certificate": cert,
            "by_profile": {},
        }
        return {"exit": {}, "calibration": calibration}

    def evaluate(c):
        seen["evaluate"] = c
        return {}

    monkeypatch.setattr(calibrate_job, "run_calibration", calibrate)
    monkeypatch.setattr(evaluate_job, "run_evaluation", evaluate)
    monkeypatch.setattr(report_job, "write_report", lambda *a: tmp_path / "report")
    stages = Stages(cfg)
    stages.calibrate()
    stages.evaluate()
    c, e = seen["calibrate"], seen["evaluate"]
    assert c.temperatures == e.temperatures == cfg.temperatures == ([0.0] if quick else [0.0, 0.6])
    recipe = read_yaml(cfg.calibrate)
    assert c.peers is (False if (quick and teacher != "toy") else recipe["peers"])
    # the demo's size when it sets one (the quick blocks: 1; the teachers' full recipes: 10), else the recipe's
    want = cfg.eval_latency_problems or read_yaml(cfg.evaluate)["latency_problems"]
    assert e.latency_problems == want and want == (1 if quick else 30 if teacher == "toy" else 10)
    # quick: one static budget (the toy's calibration adds the one it chooses on dev); else the recipe's sweep
    assert e.budget_sweep == (cfg.quick.eval_budget_sweep if quick else read_yaml(cfg.evaluate)["budget_sweep"])
    assert len(e.budget_sweep) == (1 if quick else 5)
    # samples per problem: the toy's full run compares specexit, eagle3 and the oracle on 250 x 4 at
    # T = 0.6 (the peers on 1); the calibration certifies by prompt; the quick runs take one sample
    from specexit_app.demo import EVAL_SAMPLE_METHODS

    assert e.samples == cfg.eval_samples == (4 if teacher == "toy" and not quick else 1)
    assert e.sample_methods == (list(EVAL_SAMPLE_METHODS) if e.samples > 1 else None)
    # the toy's full run: the peers on the first 100 of its 250 problems
    assert e.peer_problems == (100 if teacher == "toy" and not quick else None)
    # the effort levels: a row each, but in the realistic teachers' quick runs
    assert ("effort" in e.methods) == (teacher == "toy" or not quick)
    assert e.efforts == ["minimal", "low", "medium", "high", "xhigh", "max"]
    assert c.eval.samples == cfg.calibrate_samples
    # the final choice: Learn then Test's certificate on the toy's full run, the point estimate on quick runs
    by_recipe = "tolerance" if quick else recipe.get("selection", "tolerance")  # the toy's quick block says so
    assert c.selection == ("certified" if teacher == "toy" and not quick else by_recipe)


def test_demo_temperatures_are_checked_before_any_stage(tmp_path):
    """The calibration needs greedy first: a recipe without it fails at load, not at stage four."""
    recipe = tmp_path / "demo.yaml"
    recipe.write_text(DEFAULT_CONFIG.read_text().replace("temperatures: [0.0, 0.6]", "temperatures: [0.6]", 1))
    with pytest.raises(ConfigError, match=r"temperatures must start with 0.0.*got \[0.6\]"):
        load_demo_config(recipe)


@pytest.mark.parametrize("teacher", ["qwen3-like", "r1-llama-like"])
def test_probe_lengths_hold_the_teachers_answers(teacher):
    """The recipe's probe lengths follow the teacher's tokenizer: DEER's trial and Dynasor's probe
    (after "The answer is") hold " N." for every answer of the task (0..99), the labels' and the
    oracle's probes (after "</think>\\n\\n") every answer form the teacher writes, and its EOS."""
    from specexit_core.teachers.registry import get_teacher
    from specexit_core.toy.task import MAX_VALUE
    from specexit_core.typed_config import read_yaml

    spec = get_teacher(teacher)
    tok = spec.load_tokenizer()
    n = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    cfg = load_demo_config(teacher=teacher)
    ev, labels = read_yaml(cfg.evaluate), read_yaml(cfg.labels)
    trial = max(n(f" {v}.") for v in range(MAX_VALUE + 1))
    assert ev["deer"]["trial_max_tokens"] >= trial and ev["dynasor"]["probe_max_tokens"] >= trial
    forms = ("The answer is {v}.", "**{v}**", "Result: {v}", "**Answer: {v}**")  # realistic_traces' answer lines
    longest = max(n(f.format(v=v)) for v in range(MAX_VALUE + 1) for f in forms) + 1  # + EOS
    assert labels["probe_max_tokens"] >= longest and ev["oracle"]["probe_max_tokens"] >= longest
    # ... and no longer than a spare token or three: a probe is a request per paragraph break
    assert ev["deer"]["trial_max_tokens"] <= trial + 1 and labels["probe_max_tokens"] <= longest + 3


def test_eval_budget_sweep_is_checked_at_load(tmp_path):
    """An empty or non-positive budget list fails when the demo recipe is read, naming the field."""
    recipe = tmp_path / "demo.yaml"
    text = DEFAULT_CONFIG.read_text()
    for bad in ("[]", "[0, 48]"):
        recipe.write_text(text.replace("eval_budget_sweep: [72]", f"eval_budget_sweep: {bad}", 1))
        with pytest.raises(ConfigError, match=r"eval_budget_sweep must be a non-empty list"):
            load_demo_config(recipe, quick=True)
