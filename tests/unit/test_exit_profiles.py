"""Exit settings per sampling profile (specexit_core/exit/profiles.py): a calibrated file's
`by_profile`, the draft's `exit_profiles`, and which exit a request gets from how it is sampled."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specexit_core.exit import ExitConfig
from specexit_core.exit.profiles import SamplingProfile, load_exit_profiles, parse_profiles, resolve_exit_defaults
from specexit_core.vllm_plugin.controls import request_exit_config, sampling_profile, server_defaults

CALIBRATED = {
    "exit": {"method": "confidence", "confidence_threshold": 0.9},  # holds at every profile below
    "by_profile": {
        "T0": {"sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0}, "exit": {"confidence_threshold": 0.5}},
        "T0.6-p0.95-k20": {"sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20}, "exit": {"enabled": False}},
    },
    "calibration": {},
}


def test_profiles_are_normalised_and_named():
    assert SamplingProfile.of(0.0, 0.5, 7) == SamplingProfile.of(1e-7) == SamplingProfile(0.0)  # greedy is greedy
    assert SamplingProfile.of(0.6, None, -1) == SamplingProfile.of(0.6, 1.0, 0) == SamplingProfile(0.6)
    assert SamplingProfile.of(0.6, 0.95, 20).name == "T0.6-p0.95-k20" and SamplingProfile(0.0).name == "T0"
    assert SamplingProfile.of(0.6).matches(SamplingProfile.of(0.6000000238418579))  # float32 round trip
    for bad in ((0.6, 0.0, 0), (0.6, 1.5, 0), (float("nan"), 1.0, 0), (-1.0, 1.0, 0)):
        with pytest.raises(ValueError):
            SamplingProfile.of(*bad)


def test_a_request_gets_its_profiles_exit_else_the_joint_one(tmp_path):
    f = tmp_path / "calibrated.json"
    f.write_text(json.dumps(CALIBRATED))
    d = resolve_exit_defaults({"alpha": 0.3}, None, str(f))
    name, cfg = d.select(SamplingProfile.of(0.0, 0.8, 5))
    assert name == "T0" and cfg.confidence_threshold == 0.5 and cfg.alpha == 0.3  # the draft layer below
    assert cfg.method == ExitConfig().method  # a profile's exit replaces its layer's joint one
    name, cfg = d.select(SamplingProfile.of(0.6, 0.95, 20))
    assert name == "T0.6-p0.95-k20" and cfg.enabled is False
    for other in (SamplingProfile.of(0.6), SamplingProfile.of(0.7, 0.95, 20), None):  # no match: the joint exit
        assert d.select(other) == (None, d.joint) and d.joint.confidence_threshold == 0.9
    assert set(d.to_dict()["by_profile"]) == {"T0", "T0.6-p0.95-k20"}


def test_draft_profiles_and_server_profiles_layer_per_profile(monkeypatch):
    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", json.dumps({"exit": {"remaining_threshold": 50.0}}))
    draft_profiles = {"T0": {"sampling": {"temperature": 0}, "exit": {"min_think_tokens": 4}}}
    d = server_defaults({"confidence_threshold": 0.7}, draft_profiles)
    t0 = d.select(SamplingProfile(0.0))[1]
    assert (t0.min_think_tokens, t0.confidence_threshold, t0.remaining_threshold) == (4, 0.8, 50.0)
    assert (d.joint.min_think_tokens, d.joint.confidence_threshold) == (0, 0.7)


def test_requests_are_checked_against_their_profile():
    d = resolve_exit_defaults(None, None, json.dumps({**CALIBRATED, "exit": {"min_think_tokens": 50}}))
    with pytest.raises(ValueError, match="must be >= min_think_tokens"):  # joint: min 50
        request_exit_config({"specexit_max_think_tokens": 10}, d, sampling_profile(SimpleNamespace(temperature=1.0)))
    greedy = sampling_profile(SimpleNamespace(temperature=0.0, top_p=1.0, top_k=-1))
    assert request_exit_config({"specexit_max_think_tokens": 10}, d, greedy).max_think_tokens == 10
    # an OpenAI request that leaves the temperature to the server: not known, the joint defaults
    assert sampling_profile(SimpleNamespace(temperature=None, top_p=None)) is None


@pytest.mark.parametrize(
    "by_profile,message",
    [
        ({"T0": {"exit": {}}}, "needs a 'sampling' object"),
        ({"T0": {"sampling": {"temperature": 0.6}, "exit": {}}}, "the key must be its profile's name"),
        ({"T0": {"sampling": {"temperature": 0, "top_q": 1}, "exit": {}}}, "needs temperature"),
        ({"T0": {"sampling": {"temperature": 0}, "exit": {"alpha": 3}}}, "alpha must be in"),
        ([1], "by_profile must be an object"),
    ],
)
def test_malformed_profiles_are_refused_with_their_name(by_profile, message):
    with pytest.raises(ValueError, match=message):
        parse_profiles({"exit": {}, "by_profile": by_profile}, "f.json")


def test_files_without_profiles_and_bare_settings_are_the_joint_exit():
    assert load_exit_profiles('{"confidence_threshold": 0.4}').joint == {"confidence_threshold": 0.4}
    p = load_exit_profiles('{"exit": {"alpha": 0.2}, "calibration": {}}')
    assert p.joint == {"alpha": 0.2} and p.profiles == ()


def test_the_draft_stores_its_profiles(tmp_path):
    import shutil

    from specexit_core.draft.checkpoint import set_exit_defaults
    from specexit_core.draft.config import read_specexit_fields
    from specexit_core.toy.paths import DRAFT_DIR

    shutil.copy(DRAFT_DIR / "config.json", tmp_path / "config.json")
    set_exit_defaults(tmp_path, {"alpha": 0.2}, CALIBRATED["by_profile"])
    f = read_specexit_fields(json.loads((tmp_path / "config.json").read_text()))
    assert f.exit_defaults == {"alpha": 0.2} and f.exit_profiles == CALIBRATED["by_profile"]
    with pytest.raises(ValueError, match="exit_profiles"):
        set_exit_defaults(tmp_path, None, {"T0": {"sampling": {"temperature": 0.5}, "exit": {}}})
