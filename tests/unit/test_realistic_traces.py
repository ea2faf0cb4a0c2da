"""The realistic teacher's text (issue #13, item 3): varied wording, late-caught mistakes, and the two
measured properties the issue sets (oracle overthinking 40-70%, >= 5% first answers wrong)."""

import random

import pytest

from specexit_core.teachers.qwen3_like import STYLE as QWEN3_STYLE
from specexit_core.teachers.realistic_traces import (
    FIRST_ANSWER_WRONG_MIN,
    OVERTHINKING_RANGE,
    RealisticStyle,
    make_realistic_trace,
    trace_stats,
    trap_step,
    trap_value,
)
from specexit_core.toy.task import apply, grade, problems

# each realistic teacher's style (r1-llama-like: the defaults; qwen3-like adds the trap)
STYLES = {"default": RealisticStyle(), "qwen3-like": QWEN3_STYLE}


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("seed", [0, 1])
def test_overthinking_and_first_answer_wrong_in_target(seed, style):
    s = trace_stats(1500, seed=seed, style=STYLES[style])
    assert OVERTHINKING_RANGE[0] <= s["oracle_overthinking"] <= OVERTHINKING_RANGE[1], s
    assert s["first_answer_wrong_share"] >= FIRST_ANSWER_WRONG_MIN, s


@pytest.mark.parametrize("style", sorted(STYLES))
def test_every_trace_ends_right_and_late_fixes_come_after_a_wrong_answer(style):
    rng = random.Random(0)
    n_late = 0
    openings = set()
    for p in problems("train", 600, seed=5):
        t = make_realistic_trace(p, rng, STYLES[style])
        assert grade(t.completion, p.answer), t.completion
        assert 0 <= t.answer_known_after < len(t.paragraphs)
        openings.add(t.paragraphs[-1].split()[0])
        if t.first_answer_wrong:
            n_late += 1
            first_fix = t.kinds.index("fix")
            assert t.kinds.index("summary") < first_fix == t.answer_known_after
            assert str(t.first_stated_answer) in t.paragraphs[first_fix - 1]
    assert n_late >= 30
    assert len(openings) >= 5  # wording varies


def test_paragraph_breaks_merge_with_punctuation_in_qwen3(qwen3_tokenizer):
    tok = qwen3_tokenizer
    rng = random.Random(2)
    pieces = []
    for p in problems("train", 50, seed=2):
        pieces += [tok.decode([i]) for i in tok.encode(make_realistic_trace(p, rng).think_text)]
    breaks = [x for x in pieces if x.endswith("\n\n")]
    merged = [x for x in breaks if x.strip()]
    assert len(merged) >= 0.9 * len(breaks)  # ".\n\n", ":\n\n", "**\n\n" ... not a bare "\n\n"
    assert {".\n\n"} <= set(merged)


def test_stated_result_reads_every_result_wording_and_nothing_else():
    from specexit_core.teachers.realistic_traces import _result, stated_result

    rng = random.Random(3)
    for ans in (0, 7, -12, 431):
        for _ in range(40):  # every wording _result picks from
            assert stated_result(_result(rng, ans)) == ans
    assert stated_result("Then 4 + 5 = 9. Let me double-check: 9 - 5 = 4. Yes.") is None
    assert stated_result("Wait, 3 * 4 = 12, not 14. So the answer is 20.") == 20


@pytest.mark.parametrize("style", sorted(STYLES))
def test_greedy_paths_stay_in_the_overthinking_band(style):
    """Greedy decoding writes another re-check while stopping is less likely than going on: with re-checks
    uniform in [min, max] it stops after max - 1 or max of them (hazard 1/2, then 1). Those traces, not
    the sampled mix, are what probing the trained teacher measures; they must sit in the band too (with
    max 6 they did not: 0.71-0.74 here, 0.75-0.80 probed)."""
    from dataclasses import replace

    st = STYLES[style]
    for k in (st.max_rechecks - 1, st.max_rechecks):
        s = trace_stats(1500, style=replace(st, min_rechecks=k, max_rechecks=k, p_no_recheck=0.0))
        assert OVERTHINKING_RANGE[0] <= s["oracle_overthinking"] <= OVERTHINKING_RANGE[1], (k, s)


def test_the_trap_slip_is_systematic_so_greedy_decoding_reproduces_it():
    """Every problem with a trap step (70 - 13) gets the same wrong first pass there (67: the borrow
    forgotten), stated as the first answer and fixed by the first re-check; problems without one
    never slip at it. A coin-flip slip would leave the right value the majority at that step."""
    rng = random.Random(4)
    trapped = first_wrong = 0
    for p in problems("train", 800, seed=6):
        i = trap_step(p)
        t = make_realistic_trace(p, rng, QWEN3_STYLE)
        if i is None:
            continue
        vals = p.values()
        a, (op, b) = vals[i], p.steps[i]
        assert op == "-" and a % 10 == 0 and b % 10 != 0
        wrong = trap_value(a, b)
        assert wrong == apply(a, op, b) + 10 and wrong % 10 == apply(a, op, b) % 10
        first_pass = "\n\n".join(t.paragraphs[: t.kinds.index("summary")])
        assert (
            f"{a} - {b} = {wrong}" in first_pass
            or f"{a} minus {b} is {wrong}" in first_pass
            or (f"{a} - {b} gives {wrong}" in first_pass)
        ), first_pass
        assert grade(t.completion, p.answer)
        trapped += 1
        first_wrong += t.first_answer_wrong  # not always: a later "* 0" can land on the right answer
    assert trapped >= 0.1 * 800  # ~14% of problems have a trap step
    assert first_wrong >= 0.9 * trapped
