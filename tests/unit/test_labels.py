import math

import numpy as np
import pytest

from specexit_core.labels import (
    TraceLabels,
    confidence_from_probes,
    find_think_span,
    label_trace,
    label_with_engine,
    probe_outcomes,
    probe_prompts,
    progress_remaining,
    step_boundaries,
)

THINK, END, SPLIT = 1, 2, 9
IDS = dict(split_ids={SPLIT}, think_start_id=THINK, think_end_id=END)
PROMPT = [100, 101, THINK]  # chat template already opened <think>
# think tokens at 0..5 (boundaries at 2 and 4), </think> at 6, then an answer with a split at 7
COMPLETION = [5, 6, SPLIT, 7, SPLIT, 8, END, SPLIT, 4]
CLOSE = [END, 50]


class FakeEngine:
    """Records generate calls; answers each probe with [len(prompt)] so grading can see which one."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, *, max_tokens):
        self.calls.append((prompts, max_tokens))
        return [[len(p)] for p in prompts]


def test_progress_remaining_mask_on_hand_example():
    labels = label_trace(PROMPT, COMPLETION, [1.0, 0.0], **IDS)
    assert (labels.think_start, labels.think_end) == (0, 6)
    np.testing.assert_allclose(labels.progress, [1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0, 0, 0, 0], rtol=1e-6)
    np.testing.assert_array_equal(labels.remaining, [5, 4, 3, 2, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(labels.log_remaining, [math.log1p(r) for r in [5, 4, 3, 2, 1, 0, 0, 0, 0]], rtol=1e-6)
    np.testing.assert_array_equal(labels.mask, [True] * 6 + [False] * 3)
    assert labels.progress[5] == 1.0 and labels.remaining[5] == 0  # last think token
    assert not labels.confidence[6:].any()  # nothing after </think>
    for arr in (labels.confidence, labels.progress, labels.remaining, labels.log_remaining):
        assert arr.dtype == np.float32 and arr.shape == (len(COMPLETION),)
    assert labels.mask.dtype == bool


def test_progress_remaining_with_offset_start():
    progress, remaining, mask = progress_remaining(6, 2, 5)
    np.testing.assert_allclose(progress, [0, 0, 1 / 3, 2 / 3, 1, 0], rtol=1e-6)
    np.testing.assert_array_equal(remaining, [0, 0, 2, 1, 0, 0])
    np.testing.assert_array_equal(mask, [False, False, True, True, True, False])


def test_boundaries_stay_inside_think_segment():
    assert step_boundaries(COMPLETION, {SPLIT}, 0, 6) == [2, 4]  # the split at 7 is in the answer


def test_think_start_from_completion_token():
    comp = [THINK, 5, SPLIT, 6, END, SPLIT]
    assert find_think_span(comp, think_start_id=THINK, think_end_id=END, prompt_opened_think=False) == (1, 4)
    labels = label_trace([100], comp, [1.0], prompt_opened_think=False, **IDS)
    assert labels.boundaries == [2]
    np.testing.assert_array_equal(labels.mask, [False, True, True, True, False, False])
    np.testing.assert_array_equal(labels.remaining, [0, 2, 1, 0, 0, 0])
    # no <think> at all when the completion must open it -> no span
    assert find_think_span([5, END], think_start_id=THINK, think_end_id=END, prompt_opened_think=False) is None


def test_confidence_next_step_with_initial():
    conf = confidence_from_probes(9, [2, 4], [1.0, 0.5], 0, 6, initial=0.25)
    # first step (0..2) -> initial; b=2 labels 3..4; b=4 labels 5 (the last step)
    np.testing.assert_allclose(conf, [0.25, 0.25, 0.25, 1.0, 1.0, 0.5, 0, 0, 0])


def test_confidence_same_step():
    conf = confidence_from_probes(9, [2, 4], [1.0, 0.5], 0, 6, initial=0.25, shift="same_step")
    # b=2 labels 0..2, b=4 labels 3..4, the tail after the last boundary keeps 0.5
    np.testing.assert_allclose(conf, [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0, 0, 0])


def test_confidence_without_boundaries_is_initial():
    for shift in ("next_step", "same_step"):
        conf = confidence_from_probes(4, [], [], 0, 3, initial=0.5, shift=shift)
        np.testing.assert_allclose(conf, [0.5, 0.5, 0.5, 0])


def test_label_trace_passes_shift_and_initial():
    labels = label_trace(PROMPT, COMPLETION, [1.0, 0.5], initial=0.25, **IDS)
    np.testing.assert_allclose(labels.confidence, [0.25, 0.25, 0.25, 1.0, 1.0, 0.5, 0, 0, 0])
    labels = label_trace(PROMPT, COMPLETION, [1.0, 0.5], shift="same_step", **IDS)
    np.testing.assert_allclose(labels.confidence, [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0, 0, 0])


def test_probe_prompts_exact():
    assert probe_prompts(PROMPT, COMPLETION, [2, 4], CLOSE) == [
        [100, 101, THINK, 5, 6, SPLIT, END, 50],
        [100, 101, THINK, 5, 6, SPLIT, 7, SPLIT, END, 50],
    ]


def test_probe_outcomes_one_batched_call_and_grading():
    engine = FakeEngine()
    outs = probe_outcomes(
        engine, PROMPT, COMPLETION, [2, 4], close_ids=CLOSE, grade=lambda ans: 1.0 if ans == [8] else 0.0, max_tokens=7
    )
    assert outs == [1.0, 0.0]  # first probe prompt has 8 ids
    assert len(engine.calls) == 1
    prompts, max_tokens = engine.calls[0]
    assert prompts == probe_prompts(PROMPT, COMPLETION, [2, 4], CLOSE) and max_tokens == 7
    assert probe_outcomes(engine, PROMPT, COMPLETION, [], close_ids=CLOSE, grade=lambda a: 1.0) == []
    assert len(engine.calls) == 1  # nothing to probe -> no engine call


def test_label_with_engine_end_to_end():
    engine = FakeEngine()
    labels = label_with_engine(
        engine, PROMPT, COMPLETION, grade=lambda ans: 1.0 if ans == [10] else 0.0, close_ids=CLOSE, **IDS
    )
    assert len(engine.calls) == 1 and engine.calls[0][1] == 16
    assert engine.calls[0][0] == probe_prompts(PROMPT, COMPLETION, [2, 4], CLOSE)
    assert labels.boundaries == [2, 4]
    np.testing.assert_allclose(labels.confidence, [0, 0, 0, 0, 0, 1.0, 0, 0, 0])  # second probe correct


def test_unfinished_trace_errors_without_probing():
    assert find_think_span([5, SPLIT, 6], think_start_id=THINK, think_end_id=END) is None
    with pytest.raises(ValueError, match="unfinished"):
        label_trace(PROMPT, [5, SPLIT, 6], [1.0], **IDS)
    engine = FakeEngine()
    with pytest.raises(ValueError, match="unfinished"):
        label_with_engine(engine, PROMPT, [5, SPLIT, 6], grade=lambda a: 1.0, close_ids=CLOSE, **IDS)
    assert engine.calls == []


def test_input_errors():
    with pytest.raises(ValueError, match="outcomes"):
        label_trace(PROMPT, COMPLETION, [1.0], **IDS)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        label_trace(PROMPT, COMPLETION, [1.0, 1.5], **IDS)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        label_trace(PROMPT, COMPLETION, [1.0, float("nan")], **IDS)
    with pytest.raises(ValueError, match="shift"):
        label_trace(PROMPT, COMPLETION, [1.0, 0.0], shift="later", **IDS)
    with pytest.raises(ValueError, match="shift"):
        label_with_engine(FakeEngine(), PROMPT, COMPLETION, grade=lambda a: 1.0, close_ids=CLOSE, shift="x", **IDS)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):  # a bad grader is caught too
        probe_outcomes(FakeEngine(), PROMPT, COMPLETION, [2], close_ids=CLOSE, grade=lambda a: 2.0)
    with pytest.raises(ValueError, match="outside"):
        confidence_from_probes(9, [7], [1.0], 0, 6)


def test_dict_round_trip():
    labels = label_trace(PROMPT, COMPLETION, [1.0, 0.5], initial=0.25, **IDS)
    d = labels.to_dict()
    assert all(isinstance(v, (list, int)) for v in d.values())
    back = TraceLabels.from_dict(d)
    for k in ("confidence", "progress", "remaining", "log_remaining", "mask"):
        np.testing.assert_array_equal(getattr(back, k), getattr(labels, k))
        assert getattr(back, k).dtype == getattr(labels, k).dtype
    assert (back.boundaries, back.think_start, back.think_end) == ([2, 4], 0, 6)
