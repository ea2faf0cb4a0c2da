"""`specexit demo --teacher NAME`: which recipe runs (no Ray, no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specexit_app.cli import build_parser
from specexit_app.demo_config import DEFAULT_CONFIG, demo_config_path, demo_teachers, load_demo_config
from specexit_core.typed_config import ConfigError
from support.paths import REPO_ROOT


def test_toy_stays_the_default():
    assert build_parser().parse_args(["demo"]).teacher == "toy"
    assert demo_config_path() == demo_config_path("toy") == DEFAULT_CONFIG == REPO_ROOT / "examples/toy/demo.yaml"
    cfg = load_demo_config()
    assert cfg.teacher == "toy" and cfg.traces == str(REPO_ROOT / "examples/toy/traces.yaml")


def test_every_demo_teacher_has_a_recipe_of_its_own():
    choices = demo_teachers()
    assert choices[0] == "toy" and "qwen3-like" in choices
    for name in choices[1:]:
        path = demo_config_path(name)
        assert path == REPO_ROOT / "examples" / name.replace("-", "_") / "demo.yaml" and path.exists()
        for quick in (False, True):
            cfg = load_demo_config(teacher=name, quick=quick)
            assert cfg.teacher == name and cfg.init_draft == "scratch"  # the toy's draft has another vocab
            assert all(str(path.parent) in getattr(cfg, s) for s in ("traces", "labels", "train_draft", "evaluate"))
            assert Path(cfg.workdir) != Path(load_demo_config(quick=quick).workdir)  # never the toy's folder


def test_qwen3_like_quick_is_as_small_as_the_toys():
    q, toy = load_demo_config(teacher="qwen3-like", quick=True), load_demo_config(quick=True)
    keys = ("problems", "train_steps", "calibrate_problems", "serve_requests", "eval_problems", "temperatures")
    assert {k: getattr(q, k) for k in keys} == {k: getattr(toy, k) for k in keys}


def test_config_wins_over_teacher():
    cfg = load_demo_config(DEFAULT_CONFIG, teacher="qwen3-like")
    assert cfg.teacher == "toy"


def test_unknown_teacher_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # cmd_demo sets it; restored after
    with pytest.raises(ConfigError, match=r"unknown teacher 'nope' for the demo; choose one of: toy, qwen3-like"):
        load_demo_config(teacher="nope")
    args = build_parser().parse_args(["demo", "--teacher", "nope"])
    assert args.func(args) == 2  # before Ray or any engine starts
    assert "choose one of: toy, qwen3-like" in capsys.readouterr().err


@pytest.mark.parametrize("teacher, budget", [("toy", 400), ("qwen3-like", 700)])
def test_endpoint_requests_get_the_evaluation_stage_budget(teacher, budget, monkeypatch):
    """The Serve stage's requests must hold the teacher's whole thinking: their max_tokens is the
    evaluation config's (qwen3-like thinks ~4x longer than the toy; 400 tokens cut it short)."""
    import specexit_app.demo_serve as demo_serve
    from specexit_app.demo import Stages

    seen = {}
    monkeypatch.setattr(demo_serve, "serve_and_query", lambda *a, **kw: seen.update(kw) or {})
    Stages(load_demo_config(teacher=teacher)).serve()
    assert seen["max_tokens"] == budget
