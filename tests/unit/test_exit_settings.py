"""The exit settings' one home (specexit_core.exit.settings): the config style, the never-fires
setting, calibrated files and how draft defaults, server env and request combine."""

import json
import math

import pytest
from pydantic import ValidationError

from specexit_core.exit import (
    EXIT_CONFIG_ENV,
    NEVER_FIRES,
    SIGNALS,
    ExitConfig,
    decide,
    ewma,
    ewma_step,
    load_exit_overrides,
    resolve_exit_config,
)
from specexit_core.typed_config import StrictModel

IDS = dict(split_token_ids={5}, think_start_id=100, think_end_id=101)


def test_exit_config_is_a_frozen_strict_model():
    cfg = ExitConfig()
    assert isinstance(cfg, StrictModel) and list(cfg.to_dict()) == list(ExitConfig.model_fields)
    with pytest.raises(ValidationError):
        cfg.alpha = 0.5  # frozen
    assert cfg.alpha == 0.1
    with pytest.raises(ValueError, match="bogus"):  # unknown keys are errors, as in every config
        ExitConfig(bogus=1)
    # hashable and equal by value (calibration dedupes its grid with a set)
    assert len({ExitConfig(remaining_threshold=100), ExitConfig(remaining_threshold=100.0)}) == 1
    # pydantic's lax coercions are not allowed: the texts name the field and the value
    with pytest.raises(ValueError, match="confidence_threshold must be a number, got str '0.9'"):
        ExitConfig(confidence_threshold="0.9")
    with pytest.raises(ValueError, match="enabled must be true or false, got 1"):
        ExitConfig(enabled=1)


def test_with_overrides_errors_are_plain_sentences():
    with pytest.raises(ValueError) as e:
        ExitConfig().with_overrides({"alpha": 0, "progress_threshold": 2})
    assert type(e.value) is ValueError  # not pydantic's multi-line ValidationError: HTTP 400 text
    assert str(e.value) == "progress_threshold must be in [0, 1], got 2.0; alpha must be in (0, 1], got 0.0"


def test_never_fires_only_a_budget_can_exit():
    always = [(1.0, 1.0, 0.0)] * 40  # every signal at its extreme
    tokens = [7, 5] * 20
    cfg = ExitConfig(**NEVER_FIRES)
    assert decide(tokens, always, cfg, **IDS) is None
    assert decide(tokens, always, cfg.with_overrides({"alpha": 1.0}), **IDS) is None
    d = decide(tokens, always, cfg.with_overrides({"max_think_tokens": 9}), **IDS)
    assert d.reason == "max_think_tokens" and d.index == 8
    assert decide(tokens, always, ExitConfig(), **IDS).reason == "signals"  # the defaults would exit


def test_load_exit_overrides_accepts_the_calibrated_file_and_a_bare_mapping(tmp_path):
    wrapped = tmp_path / "calibrated.json"
    wrapped.write_text(json.dumps({"exit": {"method": "confidence", "alpha": 0.3}, "calibration": {"n": 4}}))
    bare = tmp_path / "bare.json"
    bare.write_text('{"confidence_threshold": 0.9}')
    assert load_exit_overrides(wrapped) == {"method": "confidence", "alpha": 0.3}
    assert load_exit_overrides(str(bare)) == {"confidence_threshold": 0.9}
    assert load_exit_overrides(' {"exit": {"alpha": 0.2}}') == {"alpha": 0.2}  # inline JSON
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    with pytest.raises(ValueError, match="JSON object"):
        load_exit_overrides(listed)
    with pytest.raises(ValueError, match="not valid JSON"):
        load_exit_overrides("{nope")


def test_resolve_layers_draft_env_request(tmp_path):
    draft = {"confidence_threshold": 0.7, "alpha": 0.2}
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"exit": {"alpha": 0.3, "remaining_threshold": 50}}))
    assert resolve_exit_config() == ExitConfig()
    cfg = resolve_exit_config(draft, str(f), {"remaining_threshold": 20})
    assert (cfg.confidence_threshold, cfg.alpha, cfg.remaining_threshold) == (0.7, 0.3, 20.0)
    assert resolve_exit_config(draft, '{"enabled": false}').enabled is False
    with pytest.raises(ValueError, match="draft exit_defaults: alpha"):
        resolve_exit_config({"alpha": 5})
    with pytest.raises(ValueError, match=f"{EXIT_CONFIG_ENV}: unknown exit config key"):
        resolve_exit_config(None, '{"alfa": 0.1}')


def test_one_smoothing_step():
    assert ewma_step(None, 3.0, 0.1) == 3.0 and ewma_step(2.0, 4.0, 0.5) == 3.0
    assert ewma([1.0, 0.0, 0.0], 0.5) == [1.0, 0.5, 0.25] and ewma([], 0.3) == []
    assert math.isclose(ewma([0.0, 10.0], 0.1)[-1], 1.0)


def test_signal_names_have_one_home():
    from specexit_core import signals

    assert signals.SIGNALS is SIGNALS and list(signals.ACTIVATIONS) == list(SIGNALS)


def test_the_exit_package_is_pure_python():
    """The Serve front end and the request validation import it: no torch, no vLLM, no Ray."""
    import subprocess
    import sys

    code = (
        "import sys, specexit_core.exit, specexit_core.exit.replay; "
        "print(sorted(m for m in ('torch', 'vllm', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
