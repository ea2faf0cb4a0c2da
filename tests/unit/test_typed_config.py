"""The one config style: `load_config` (overrides, errors), the one path rule, and that every
run config goes through them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import Field

from specexit_core.teachers.model_ref import resolve_model
from specexit_core.typed_config import ConfigError, StrictModel, load_config, resolve_path
from support.paths import REPO_ROOT


class _Inner(StrictModel):
    path: str = "x"
    n: int = Field(1, ge=1)


class _Outer(StrictModel):
    output: str
    inner: _Inner = Field(default_factory=_Inner)

    def resolve_paths(self) -> _Outer:
        self.output = resolve_path(self.output)
        return self


def test_one_config_error_class():
    import pipelines.common.config as common

    assert common.ConfigError is ConfigError and issubclass(ConfigError, ValueError)


def test_unknown_and_bad_keys_name_the_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("output: o\ninner: {pth: 3}\n")
    with pytest.raises(ConfigError, match=r"(?s)invalid thing config .*c\.yaml.*inner\.pth"):
        load_config(_Outer, f, what="thing")
    f.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_Outer, f)


def test_overrides_dotted_none_skipped_raw_untouched(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECEXIT_ROOT", str(tmp_path))
    raw = {"output": "o", "inner": {"path": "p"}}
    cfg = load_config(_Outer, raw=raw, overrides={"inner.n": 5, "output": None, "inner.path": None})
    assert (cfg.output, cfg.inner.path, cfg.inner.n) == (str(tmp_path / "o"), "p", 5)  # resolve_paths ran
    assert raw == {"output": "o", "inner": {"path": "p"}}
    assert load_config(_Outer, raw={"output": "o"}, overrides={"inner.path": "q"}).inner.path == "q"
    with pytest.raises(ConfigError, match="inner.n"):
        load_config(_Outer, raw=raw, overrides={"inner.n": 0})


def test_the_path_rule(monkeypatch, tmp_path):
    from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR

    monkeypatch.setenv("SPECEXIT_ROOT", str(tmp_path))
    monkeypatch.chdir(REPO_ROOT)
    assert resolve_path("runs/x") == str(tmp_path / "runs/x")
    assert resolve_path("/abs/x") == "/abs/x" and resolve_path(None) is None
    assert resolve_path("s3://bucket/x") == resolve_model("s3://bucket/x") == "s3://bucket/x"
    assert resolve_model("toy:teacher") == str(TEACHER_DIR) and resolve_model("toy:draft") == str(DRAFT_DIR)
    with pytest.raises(ConfigError, match="toy:nope"):
        resolve_model("toy:nope")
    assert resolve_model("Qwen/Qwen3-4B-Thinking-2507") == "Qwen/Qwen3-4B-Thinking-2507"  # a hub id
    # not under SPECEXIT_ROOT, but in the cwd (a job's copy of the working dir)
    assert resolve_model("specexit_core/toy/assets/teacher") == str(TEACHER_DIR)
    (tmp_path / "m").mkdir()
    assert resolve_model("m") == str(tmp_path / "m")  # the root first
    assert resolve_model("./missing") == str(tmp_path / "missing")  # spelled as a path: absolute


def test_serve_and_pipelines_share_the_path_rule(monkeypatch, tmp_path):
    from pipelines.common.config import EngineConfig
    from serve_app.config import load_args

    monkeypatch.setenv("SPECEXIT_ROOT", str(tmp_path))
    (tmp_path / "teacher").mkdir()
    args = load_args({"model": {"id": "m", "source": "teacher", "draft": "toy:draft", "accelerator": "cpu"}})
    engine = EngineConfig(model="teacher").resolve_paths()
    assert args.model.source == engine.model == str(tmp_path / "teacher")
    assert args.model.draft == resolve_model("toy:draft")


def test_demo_quick_and_command_line_overrides(monkeypatch, tmp_path):
    from specexit_app.demo_config import load_demo_config

    monkeypatch.setenv("SPECEXIT_ROOT", str(tmp_path))
    full, quick = load_demo_config(), load_demo_config(quick=True)
    assert full.workdir == str(tmp_path / "runs/demo") and quick.workdir == str(tmp_path / "runs/demo-quick")
    assert quick.problems == full.quick.problems and quick.temperatures == full.quick.temperatures
    assert Path(quick.traces).is_file() and Path(quick.serve).is_file()  # stage files: in the checkout
    cli = load_demo_config(quick=True, workdir="w", port=8123)
    assert (cli.workdir, cli.serve_port, cli.problems) == (str(tmp_path / "w"), 8123, quick.problems)
    bad = tmp_path / "demo.yaml"
    bad.write_text((REPO_ROOT / "examples/toy/demo.yaml").read_text() + "quick_mode: true\n")
    with pytest.raises(ConfigError, match="quick_mode"):
        load_demo_config(bad)


def test_cpu_engine_env_is_the_one_rule(monkeypatch):
    import torch._dynamo.config as dynamo

    from specexit_core.vllm_env import all_cores_bind, apply_cpu_defaults, cpu_engine_env

    off = {"TORCH_COMPILE_DISABLE": "1"}  # the engines run eager: no compile of vLLM's sampler helpers
    assert cpu_engine_env(3) == {"VLLM_CPU_KVCACHE_SPACE": "3", **off}
    assert cpu_engine_env(2, "0|1") == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0|1", **off}
    for k in ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "TORCH_COMPILE_DISABLE"):
        monkeypatch.delenv(k, raising=False)  # restored after the test
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    monkeypatch.setattr(dynamo, "disable", False)  # torch read the variable at import, before the defaults
    apply_cpu_defaults(4)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4" and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0"  # user wins
    assert os.environ["TORCH_COMPILE_DISABLE"] == "1" and dynamo.disable is True
    assert all_cores_bind().startswith("0")


@pytest.mark.parametrize(
    ("engine_core", "gpu", "tp", "in_process"),
    [
        ("auto", False, 1, True),  # CPU, one engine process: in the actor (fast start)
        ("auto", False, 2, False),  # tensor parallel: vLLM's worker processes
        ("auto", True, 1, False),  # GPU: vLLM's default, a separate engine core
        ("process", False, 1, False),
        ("in_process", True, 1, True),
    ],
)
def test_engine_actors_get_the_engine_core_mode(engine_core, gpu, tp, in_process):
    """`engine.engine_core` decides VLLM_ENABLE_V1_MULTIPROCESSING in the engine actors' environment."""
    from pipelines.common.config import EngineConfig
    from pipelines.common.runtime import engine_env

    e = EngineConfig(model="m", engine_core=engine_core, tensor_parallel_size=tp)
    env = engine_env(e, gpu)
    # said both ways: the actor would otherwise inherit whatever its raylet's environment says
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == ("0" if in_process else "1")
    assert ("VLLM_CPU_KVCACHE_SPACE" in env) is not gpu


def test_engine_core_mode_is_checked():
    from pipelines.common.config import EngineConfig

    with pytest.raises(ValueError, match="engine_core"):
        EngineConfig(model="m", engine_core="thread")
