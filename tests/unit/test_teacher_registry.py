"""The built-in teachers' registry: one spec per teacher, the CLI's choices, and what each ships
(compact weights + its tokenizer) within issue #13's 40 MB, covering held-out text."""

from __future__ import annotations

import json
import random

import pytest

from specexit_core.teachers.registry import TEACHERS, get_teacher


def test_registry_names_and_error():
    assert {"qwen3-like", "r1-llama-like"} <= set(TEACHERS)
    assert get_teacher("r1-llama-like").reasoning_parser == "deepseek_r1"
    assert get_teacher("qwen3-like").reasoning_parser == "qwen3"
    with pytest.raises(ValueError, match="choices: .*qwen3-like.*r1-llama-like"):
        get_teacher("llama-like")


def test_specs_agree_with_their_tokenizers():
    for spec in TEACHERS.values():
        files = {f.name for f in spec.tokenizer_dir.glob("*.json")}
        assert {"tokenizer.json", "tokenizer_config.json"} <= files, spec.name
        cfg = json.loads((spec.tokenizer_dir / "tokenizer_config.json").read_text())
        dec = cfg["added_tokens_decoder"]
        assert dec[str(spec.think_start_id)]["content"] == "<think>", spec.name
        assert dec[str(spec.think_end_id)]["content"] == "</think>", spec.name
        assert spec.think_end_id < spec.full_vocab_size


def test_cli_takes_the_teacher_names_from_the_registry(capsys):
    from specexit_app.cli import build_parser

    ap = build_parser()
    for name in TEACHERS:
        assert ap.parse_args(["teacher", "build", name, "--steps", "3"]).name == name
        assert ap.parse_args(["teacher", "materialize", name]).name == name
    with pytest.raises(SystemExit):
        ap.parse_args(["teacher", "check", "no-such-teacher"])
    assert "r1-llama-like" in capsys.readouterr().err


def test_materialise_default_dir_per_teacher(monkeypatch, tmp_path):
    from specexit_core.teachers.materialize import CACHE_ENV, default_dir

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert default_dir("r1-llama-like") == tmp_path / "r1-llama-like"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    assert default_dir("qwen3-like") == tmp_path / "c" / "specexit" / "teachers" / "qwen3-like"


@pytest.mark.parametrize("name", sorted(TEACHERS))
def test_shipped_teacher_within_budget_and_covers_held_out_text(name):
    from specexit_core.teachers.build import BUILD_CONFIG, COMPACT_WEIGHTS, TEACHER_META, load_build_config
    from specexit_core.teachers.realistic_traces import RealisticStyle
    from specexit_core.toy.task import problems

    spec = get_teacher(name)
    if not (spec.assets_dir / COMPACT_WEIGHTS).exists():
        pytest.skip(f"{name} not built yet (specexit teacher build {name})")
    shipped = [spec.assets_dir / COMPACT_WEIGHTS, *spec.tokenizer_dir.glob("*.json")]
    assert sum(f.stat().st_size for f in shipped) <= 40 * 10**6
    meta = json.loads((spec.assets_dir / TEACHER_META).read_text())
    assert meta["full_vocab_size"] == spec.full_vocab_size
    load_build_config(spec, json.loads((spec.assets_dir / BUILD_CONFIG).read_text()))
    tok, used, rng = spec.load_tokenizer(), set(meta["used_ids"]), random.Random(1)
    for p in problems("test", 40, seed=5):
        ids, _ = spec.encode_example(tok, *spec.render_example(tok, p, rng, RealisticStyle()))
        assert set(ids) <= used


@pytest.mark.parametrize("name", sorted(TEACHERS))
def test_the_default_recipe_is_the_shipped_builds(name):
    """`specexit teacher build NAME` with no --config trains what ships (up to the thread count, a
    property of the machine it ran on)."""
    from specexit_core.teachers.build import BUILD_CONFIG, default_config, load_build_config

    spec = get_teacher(name)
    if not (spec.assets_dir / BUILD_CONFIG).exists():
        pytest.skip(f"{name} not built yet")
    shipped = load_build_config(spec, json.loads((spec.assets_dir / BUILD_CONFIG).read_text())).to_json()
    default = default_config(spec).to_json()
    assert {k: v for k, v in shipped.items() if k != "threads"} == {k: v for k, v in default.items() if k != "threads"}
