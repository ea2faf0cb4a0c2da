"""The draft's `specexit.exit_defaults`: a DraftConfig field, read through one reader, kept by
`specexit draft convert` and by calibration's update of the draft."""

import json
from types import SimpleNamespace

import pytest
import torch

from specexit_core.draft.checkpoint import convert, read_config, save_draft, set_exit_defaults
from specexit_core.draft.config import DraftConfig, read_specexit_fields
from specexit_core.draft.model import SpecExitDraft

TOKEN_IDS = {"think_start": 40, "think_end": 41, "split": [5, 6]}
DEFAULTS = {"method": "confidence", "confidence_threshold": 0.6, "alpha": 0.3}


def small_cfg(**kw) -> DraftConfig:
    base = dict(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        vocab_size=50,
        draft_vocab_size=30,
        aux_layer_ids=(1, 2, 3),
        target_hidden_size=16,
        token_ids=TOKEN_IDS,
    )
    return DraftConfig(**{**base, **kw})


def saved(tmp_path, name="se", **kw):
    torch.manual_seed(0)
    d = SpecExitDraft(small_cfg(**kw))
    d.t2d[:30] = True
    return save_draft(d, tmp_path / name)


def test_exit_defaults_is_a_validated_field_of_the_config_json():
    cfg = small_cfg(exit_defaults=DEFAULTS)
    j = cfg.to_hf_json()
    assert j["specexit"]["exit_defaults"] == DEFAULTS
    assert DraftConfig.from_hf_json(j) == cfg
    assert "exit_defaults" not in small_cfg().to_hf_json()["specexit"]
    with pytest.raises(ValueError, match="exit_defaults: unknown exit config key.*confidence_treshold"):
        small_cfg(exit_defaults={"confidence_treshold": 0.9})
    with pytest.raises(ValueError, match="exit_defaults: alpha"):
        small_cfg(exit_defaults={"alpha": 3})


def test_one_reader_for_config_json_and_vllms_config_object():
    j = small_cfg(exit_defaults=DEFAULTS).to_hf_json()
    for config in (j, SimpleNamespace(**j)):  # vLLM hands the plugin a transformers config object
        f = read_specexit_fields(config)
        assert f.signals == ("confidence", "progress", "remaining")
        assert f.token_ids == TOKEN_IDS and f.exit_defaults == DEFAULTS
    stock = small_cfg(signals=()).to_hf_json()
    assert read_specexit_fields(stock) == ((), None, None, None, None) == read_specexit_fields(SimpleNamespace())


def test_convert_keeps_exit_defaults(tmp_path):
    src = saved(tmp_path, exit_defaults=DEFAULTS)
    assert read_config(src).exit_defaults == DEFAULTS
    # SpecExit -> stock: a stock drafter has no `specexit` block at all
    stock = convert(src, tmp_path / "stock", add_signals=False)
    assert "specexit" not in json.loads((stock / "config.json").read_text())
    # a stock checkpoint whose config carries the SpecExit fields -> SpecExit: they survive
    j = json.loads((stock / "config.json").read_text())
    j["specexit"] = {"token_ids": TOKEN_IDS, "exit_defaults": DEFAULTS}
    (stock / "config.json").write_text(json.dumps(j))
    back = read_config(convert(stock, tmp_path / "back", add_signals=True))
    assert back.signals and back.token_ids == TOKEN_IDS and back.exit_defaults == DEFAULTS


def test_set_exit_defaults_rewrites_only_the_specexit_block(tmp_path):
    src = saved(tmp_path)
    j = json.loads((src / "config.json").read_text())
    j["specexit_train"] = {"step": 7}  # someone else's key
    (src / "config.json").write_text(json.dumps(j))
    set_exit_defaults(src, DEFAULTS)
    after = json.loads((src / "config.json").read_text())
    assert after["specexit"]["exit_defaults"] == DEFAULTS and after["specexit_train"] == {"step": 7}
    assert read_config(src) == small_cfg(exit_defaults=DEFAULTS)
    set_exit_defaults(src, None)
    assert read_config(src).exit_defaults is None
    with pytest.raises(ValueError, match="alpha"):
        set_exit_defaults(src, {"alpha": 0})
    stock = convert(src, tmp_path / "stock", add_signals=False)
    with pytest.raises(ValueError, match="stock EAGLE-3"):
        set_exit_defaults(stock, DEFAULTS)


def test_effort_levels_travel_with_the_draft(tmp_path):
    """A calibrated file's `efforts` stored as `specexit.exit_efforts`: validated, read by the one reader,
    and what a server built from the draft serves a request's `specexit_effort` with."""
    from specexit_core.exit.profiles import SamplingProfile
    from specexit_core.vllm_plugin.controls import request_exit_config, server_defaults

    efforts = {"low": {"epsilon": 0.05, "exit": {"confidence_threshold": 0.3}}}
    src = saved(tmp_path)
    set_exit_defaults(src, DEFAULTS, None, efforts)
    f = read_specexit_fields(json.loads((src / "config.json").read_text()))
    assert f.exit_efforts == efforts and read_config(src).exit_efforts == efforts
    d = server_defaults(f.exit_defaults, f.exit_profiles, f.exit_efforts)
    greedy = SamplingProfile.of(0.0)
    assert request_exit_config({"specexit_effort": "low"}, d, greedy).confidence_threshold == 0.3
    assert request_exit_config({}, d, greedy).confidence_threshold == 0.6  # no level: exit_defaults
    with pytest.raises(ValueError, match="efforts.low"):
        small_cfg(exit_efforts={"low": {"epsilon": 0.05}})
