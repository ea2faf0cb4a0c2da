"""Reasoning effort levels as certified exit operating points (specexit_core/exit/efforts.py): which
calibrated level serves a request, how a calibrated file's `efforts` reach a server's defaults, and a
request's `specexit_effort` control."""

from __future__ import annotations

import json

import pytest

from specexit_core.exit import ExitConfig
from specexit_core.exit.efforts import EFFORTS, check_epsilons, parse_effort, serving_level
from specexit_core.exit.profiles import SamplingProfile, load_exit_profiles, resolve_exit_defaults
from specexit_core.vllm_plugin.controls import request_effort, request_exit_config


def _file(tmp_path):
    """A calibrated file with two levels: low (aggressive) and high (conservative)."""
    data = {
        "exit": {"confidence_threshold": 0.7},
        "efforts": {
            "low": {"epsilon": 0.05, "exit": {"confidence_threshold": 0.3}},
            "high": {
                "epsilon": 0.01,
                "exit": {"confidence_threshold": 0.9},
                "by_profile": {"T0.6": {"sampling": {"temperature": 0.6}, "exit": {"confidence_threshold": 0.95}}},
            },
        },
    }
    f = tmp_path / "calibrated.json"
    f.write_text(json.dumps(data))
    return f


def test_levels_are_vllms_and_a_missing_one_is_served_more_conservatively():
    assert EFFORTS == ("none", "minimal", "low", "medium", "high", "xhigh", "max")
    have = ["low", "high"]
    assert [serving_level(x, have) for x in EFFORTS] == [None, "low", "low", "high", "high", "max", "max"]
    assert parse_effort(" LOW ") == "low"
    with pytest.raises(ValueError, match="none, minimal, low"):
        parse_effort("extreme")
    with pytest.raises(ValueError, match="must not allow more loss"):
        check_epsilons({"low": 0.01, "high": 0.05})
    with pytest.raises(ValueError, match="certified levels"):
        check_epsilons({"max": 0.5})


def test_a_calibrated_files_efforts_become_each_levels_defaults(tmp_path):
    f = _file(tmp_path)
    assert [lv for lv, _, _ in load_exit_profiles(str(f)).efforts] == ["low", "high"]
    d = resolve_exit_defaults(None, None, str(f))
    sampled, greedy = SamplingProfile.of(0.6), SamplingProfile.of(0.0)

    def cfg(level, sampling=greedy):
        xargs = {} if level is None else {"specexit_effort": level}
        return request_exit_config(xargs, d, sampling)

    assert cfg(None).confidence_threshold == 0.7  # no level: the file's exit
    assert cfg("minimal").confidence_threshold == cfg("low").confidence_threshold == 0.3
    assert cfg("medium").confidence_threshold == 0.9  # not calibrated: the next more conservative, high
    assert cfg("high", sampled).confidence_threshold == 0.95  # the level's own profile
    top = cfg("max")
    assert top.enabled and top.confidence_threshold == 1.0  # no early exit: the signals never fire ...
    assert (
        request_exit_config({"specexit_effort": "max", "specexit_max_think_tokens": 8}, d, greedy).max_think_tokens == 8
    )
    _, info = d.for_effort("medium")
    assert info == {"effort": "medium", "served_by": "high", "epsilon": 0.01}  # ... what usage reports
    with pytest.raises(ValueError, match="reasoning effort"):
        request_effort({"specexit_effort": "turbo"})
    # a server with no calibrated level: every level but max keeps the server's own exit
    bare = resolve_exit_defaults({"confidence_threshold": 0.6}, None, None)
    assert bare.for_effort("low")[1] == {"effort": "low", "served_by": "default", "epsilon": None}
    assert request_exit_config({"specexit_effort": "low"}, bare, greedy).confidence_threshold == 0.6
    assert request_exit_config({"specexit_effort": "max"}, bare, greedy).confidence_threshold == 1.0


def test_a_bad_efforts_block_names_the_level(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"exit": {}, "efforts": {"low": {"epsilon": 0.05}}}))
    with pytest.raises(ValueError, match="efforts.low needs an 'exit'"):
        load_exit_profiles(str(f))
    f.write_text(json.dumps({"exit": {}, "efforts": {"low": {"exit": {"alpha": 7}}}}))
    with pytest.raises(ValueError, match=r"SPECEXIT_EXIT_CONFIG \(effort low\): alpha"):
        resolve_exit_defaults(None, None, str(f))
    assert ExitConfig().enabled  # untouched
