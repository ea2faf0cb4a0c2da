"""`teacher:NAME` in any model field: a built-in teacher's full checkpoint, materialised on first use,
reused while up to date, safe when several processes of one node resolve it at once."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest

from specexit_core.teachers import model_ref
from specexit_core.teachers.model_ref import resolve_model
from specexit_core.typed_config import ConfigError


def _fake_builder(root: Path, weights: str = "w1"):
    """A teacher whose 'shipped weights' are the string `weights`; as the real one, a folder is up to
    date when its source.json names them, and materialize writes the folder (slowly, file by file)."""
    target = root / "fake-teacher"
    src = {"weights": weights}

    def is_up_to_date(out: Path) -> bool:
        marker = out / "source.json"
        return marker.exists() and json.loads(marker.read_text()) == src

    def build(out: Path) -> Path:
        (out / "calls").mkdir(parents=True, exist_ok=True)
        (out / "calls" / f"{time.time_ns()}").write_text("")
        (out / "config.json").write_text("{}")
        time.sleep(0.2)  # a reader must never see the folder without its weights
        (out / "model.safetensors").write_text(weights)
        (out / "source.json").write_text(json.dumps(src))
        return out

    return target, is_up_to_date, build


def _resolve_in_child(root: str, q) -> None:
    model_ref.builtin_teacher = lambda name: _fake_builder(Path(root))
    path = Path(model_ref.teacher_model("teacher:fake"))
    q.put((str(path), (path / "model.safetensors").read_text()))


def test_materialises_once_then_reuses_and_rebuilds_when_the_weights_change(tmp_path, monkeypatch):
    monkeypatch.setattr(model_ref, "builtin_teacher", lambda name: _fake_builder(tmp_path))
    first = resolve_model("teacher:fake")
    assert first == str(tmp_path / "fake-teacher")
    assert (Path(first) / "model.safetensors").read_text() == "w1"
    calls = list((Path(first) / "calls").iterdir())
    assert resolve_model("teacher:fake") == first
    assert list((Path(first) / "calls").iterdir()) == calls  # reused: not built again
    monkeypatch.setattr(model_ref, "builtin_teacher", lambda name: _fake_builder(tmp_path, "w2"))
    assert (Path(resolve_model("teacher:fake")) / "model.safetensors").read_text() == "w2"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".fake-teacher.tmp")) == []


def test_concurrent_resolution_builds_once_and_never_sees_a_partial_folder(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_resolve_in_child, args=(str(tmp_path), q)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got == [(str(tmp_path / "fake-teacher"), "w1")] * 4
    assert len(list((tmp_path / "fake-teacher" / "calls").iterdir())) == 1  # one build, three reuses


def test_unknown_and_empty_teacher_names_are_config_errors():
    with pytest.raises(ConfigError, match=r"unknown built-in teacher 'nope'; known: qwen3-like"):
        resolve_model("teacher:nope")
    with pytest.raises(ConfigError, match="empty teacher name"):
        resolve_model("teacher:")


def test_qwen3_like_resolves_to_its_full_checkpoint(tmp_path, monkeypatch):
    from specexit_core.teachers.materialize import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    path = Path(resolve_model("teacher:qwen3-like"))
    assert path == tmp_path / "qwen3-like"
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == 151936
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("teacher:qwen3-like") == str(path)
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rewritten


def test_stage_configs_take_teacher_refs(tmp_path, monkeypatch):
    from pipelines.stages import load_stage_config

    monkeypatch.setattr(model_ref, "builtin_teacher", lambda name: _fake_builder(tmp_path))
    cfg = load_stage_config(
        "traces", None, raw={"input": {"kind": "toy"}, "output": str(tmp_path / "o"), "engine": {"model": "teacher:x"}}
    )
    assert cfg.engine.model == str(tmp_path / "fake-teacher")
