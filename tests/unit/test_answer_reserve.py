"""The answer reserve (specexit_core/exit/answer_reserve.py): the think budget that leaves an answer
its tokens of max_tokens, how it meets a request's own budget, and how its exit is reported."""

import pytest

from specexit_core.exit import NEVER_FIRES, ExitConfig, ExitDecision, ExitTracker
from specexit_core.exit.answer_reserve import ANSWER_RESERVE, MARKERS, reported, reserve_budget, with_answer_reserve
from specexit_core.vllm_plugin.controls import request_exit_config, server_defaults


def test_budget_leaves_the_reserve_and_the_markers():
    assert reserve_budget(400, 16) == 400 - 16 - MARKERS == 382
    assert reserve_budget(40, 16) == 22
    assert reserve_budget(10, 16) == 1  # never below one think token: the answer gets what is left
    assert reserve_budget(None, 16) is None and reserve_budget(400, 0) is None  # no limit / off


def test_the_tighter_budget_holds_and_the_reserve_beats_the_minimum():
    cfg, binds = with_answer_reserve(ExitConfig(), 40)
    assert binds and cfg.max_think_tokens == 22
    own, binds = with_answer_reserve(ExitConfig(max_think_tokens=10), 40)
    assert not binds and own.max_think_tokens == 10  # the request's own budget is tighter: it stays
    cfg, binds = with_answer_reserve(ExitConfig(min_think_tokens=50), 40)
    assert binds and cfg.max_think_tokens == 22 and cfg.min_think_tokens == 22
    never, binds = with_answer_reserve(ExitConfig().with_overrides(NEVER_FIRES), 40)
    assert binds and never.max_think_tokens == 22  # effort `max`: no signal exit, the reserve still holds


def test_off_and_disabled_get_no_reserve():
    off = ExitConfig(enabled=False)
    assert with_answer_reserve(off, 40) == (off, False)  # plain decoding
    zero = ExitConfig(answer_reserve_tokens=0)
    assert with_answer_reserve(zero, 40) == (zero, False)
    assert with_answer_reserve(ExitConfig(), 1000)[0].max_think_tokens == 982


def test_a_budget_exit_under_the_reserve_is_reported_as_answer_reserve():
    budget = ExitDecision(21, "max_think_tokens", 22, {})
    assert reported(budget, True).reason == ANSWER_RESERVE == "answer_reserve"
    assert reported(budget, False) is budget
    signals = ExitDecision(5, "signals", 6, {"confidence": 0.9})
    assert reported(signals, True) is signals


def test_the_tracker_closes_thinking_at_the_reserve_budget():
    """What both engines do with the setting: `</think>` after the budget's last think token, so
    max_tokens - budget - 1 tokens remain for the answer (one more when the prompt opened `<think>`)."""
    cfg, _ = with_answer_reserve(ExitConfig().with_overrides(NEVER_FIRES), 30)
    tr = ExitTracker(cfg, split_token_ids=[7], think_start_id=1, think_end_id=2, in_think=True)
    decision = None
    for _ in range(40):
        tr.add_signal((0.5, 0.5, 10.0))
        decision = tr.append(5)
        if decision:
            break
    assert decision.think_tokens == 12 == 30 - 16 - MARKERS and decision.index == 11


def test_request_control_and_validation():
    cfg = request_exit_config({"specexit_answer_reserve_tokens": "32"}, server_defaults())
    assert cfg.answer_reserve_tokens == 32
    assert request_exit_config({"specexit_answer_reserve_tokens": 8.0}, server_defaults()).answer_reserve_tokens == 8
    with pytest.raises(ValueError, match="answer_reserve_tokens must be >= 0"):
        ExitConfig(answer_reserve_tokens=-1)
    with pytest.raises(ValueError, match="answer_reserve_tokens must be an integer"):
        ExitConfig(answer_reserve_tokens=2.5)


def test_a_prompt_closed_thinking_when_its_last_marker_is_the_end():
    from specexit_core.exit.policy import prompt_closed_thinking

    assert prompt_closed_thinking([9, 1, 8, 2, 7], think_start_id=1, think_end_id=2)  # enable_thinking false
    assert not prompt_closed_thinking([9, 2, 8, 1], think_start_id=1, think_end_id=2)  # opened again
    assert not prompt_closed_thinking([9, 8], think_start_id=1, think_end_id=2)  # the model opens it itself
    assert not prompt_closed_thinking([], think_start_id=1, think_end_id=2)
