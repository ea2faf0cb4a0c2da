"""Per-request SpecExit controls and the version gate (no engine needed)."""

import pytest

from specexit_core.exit import ExitConfig
from specexit_core.vllm_plugin.controls import overrides_from_extra_args, request_exit_config, server_defaults
from specexit_core.vllm_plugin.version import check_vllm_version, is_supported


def test_flat_keys_from_openai_vllm_xargs():
    cfg = request_exit_config(
        {
            "specexit_method": "progress",
            "specexit_progress_threshold": "0.5",
            "specexit_max_think_tokens": 64.0,
            "other": 1,
        },
        ExitConfig(),
    )
    assert cfg.method == "progress" and cfg.progress_threshold == 0.5 and cfg.max_think_tokens == 64


@pytest.mark.parametrize("v,want", [(False, False), (0, False), ("off", False), ("true", True), (1, True)])
def test_switch(v, want):
    assert request_exit_config({"specexit": v}, ExitConfig()).enabled is want
    assert request_exit_config({"specexit_enabled": v}, ExitConfig()).enabled is want


def test_nested_dict_offline():
    cfg = request_exit_config({"specexit": {"confidence_threshold": 0.95, "alpha": 0.2}}, ExitConfig())
    assert cfg.confidence_threshold == 0.95 and cfg.alpha == 0.2


@pytest.mark.parametrize(
    "args,msg",
    [
        ({"specexit_threshold": 1}, "unknown SpecExit control 'specexit_threshold'"),
        ({"specexit": {"bogus": 1}}, "unknown SpecExit control 'bogus'"),
        ({"specexit_alpha": "x"}, "must be a number"),
        ({"specexit_alpha": 0}, "alpha"),
        ({"specexit_confidence_threshold": 1.5}, "confidence_threshold"),
        ({"specexit_method": "vibes"}, "vibes"),
        ({"specexit_enabled": "maybe"}, "boolean"),
        ({"specexit_min_think_tokens": -1}, "min_think_tokens"),
    ],
)
def test_bad_controls_are_clear_errors(args, msg):
    with pytest.raises(ValueError, match=msg):
        request_exit_config(args, ExitConfig())


def test_no_args_no_overrides():
    assert overrides_from_extra_args(None) == {} and overrides_from_extra_args({"x": 1}) == {}


def test_server_defaults_from_draft_defaults_and_env(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECEXIT_EXIT_CONFIG", raising=False)
    assert server_defaults({"confidence_threshold": 0.7}).joint.confidence_threshold == 0.7
    assert server_defaults(None).joint == ExitConfig() and server_defaults(None).by_profile == ()
    f = tmp_path / "exit.json"
    f.write_text('{"exit": {"remaining_threshold": 50}}')
    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", str(f))
    cfg = server_defaults({"confidence_threshold": 0.7}).joint
    assert cfg.confidence_threshold == 0.7 and cfg.remaining_threshold == 50
    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", '{"bogus": 1}')
    with pytest.raises(ValueError, match="SPECEXIT_EXIT_CONFIG: unknown exit config key.*bogus"):
        server_defaults()


def test_bad_control_messages_are_one_clear_line():
    """They become the OpenAI server's HTTP 400 text: no pydantic framing, the field and the rule."""
    with pytest.raises(ValueError) as e:
        request_exit_config({"specexit_alpha": 2}, ExitConfig())
    assert str(e.value) == "alpha must be in (0, 1], got 2.0"
    with pytest.raises(ValueError) as e:
        request_exit_config({"specexit": {"min_think_tokens": 9, "max_think_tokens": 3}}, ExitConfig())
    assert str(e.value) == "max_think_tokens (3) must be >= min_think_tokens (9)"


def test_version_gate():
    assert is_supported("0.32.0") and is_supported("0.32.7+cpu")
    assert not is_supported("0.31.2") and not is_supported("0.33.0")
    with pytest.raises(RuntimeError, match=r"supports vLLM >=0.32.0 <0.33.0.*found 0.31.0"):
        check_vllm_version("0.31.0")


def test_requests_are_validated_against_the_resolved_server_defaults(monkeypatch):
    """#16 item 1: a budget below the server's min_think_tokens is rejected up front (it used to
    pass the front-end check against ExitConfig() and raise inside the worker)."""
    from types import SimpleNamespace

    from specexit_core.draft.config import SPECEXIT_ARCH
    from specexit_core.vllm_plugin.controls import engine_defaults

    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", '{"min_think_tokens": 50}')
    hf = SimpleNamespace(architectures=[SPECEXIT_ARCH], specexit={"exit_defaults": {"confidence_threshold": 0.7}})
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf)))
    d = engine_defaults(cfg)
    assert d.joint.min_think_tokens == 50 and d.joint.confidence_threshold == 0.7
    with pytest.raises(ValueError, match=r"max_think_tokens \(10\) must be >= min_think_tokens \(50\)"):
        request_exit_config({"specexit_max_think_tokens": 10}, d)
    assert request_exit_config({"specexit_max_think_tokens": 60}, d).max_think_tokens == 60
    assert engine_defaults(SimpleNamespace(speculative_config=None)) is None  # not a SpecExit engine


def _spec_config(archs=None, model=None):
    from types import SimpleNamespace

    hf = SimpleNamespace(architectures=archs) if archs is not None else None
    return SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf), model=model)


def test_v1_is_pinned_only_for_specexit_drafts(tmp_path):
    """#18 item 2: engines without a SpecExit draft keep vLLM's runner choice (V2 on CUDA)."""
    from specexit_core.draft.config import SPECEXIT_ARCH
    from specexit_core.vllm_plugin.runner_choice import is_specexit_draft, wants_v1

    assert wants_v1(None, None) is None  # no speculative decoding
    assert wants_v1(_spec_config(["LlamaForCausalLMEagle3"]), None) is None  # stock EAGLE-3
    assert wants_v1(_spec_config(["LlamaForCausalLMEagle3"]), True) is None
    assert wants_v1(_spec_config([SPECEXIT_ARCH]), None) is True
    assert wants_v1(_spec_config([SPECEXIT_ARCH]), False) is True
    with pytest.raises(RuntimeError, match="V1 model runner only"):
        wants_v1(_spec_config([SPECEXIT_ARCH]), True)
    (tmp_path / "config.json").write_text(f'{{"architectures": ["{SPECEXIT_ARCH}"]}}')
    assert is_specexit_draft(_spec_config(None, model=str(tmp_path)))  # before vLLM loads the hf config
