"""`specexit demo --teacher qwen3-like --quick --json`: the whole loop on the built-in qwen3-like teacher
(Qwen3's real 151,936-id vocabulary and chat template). Mechanics, not accuracy: traces in Qwen3's
template that close `</think>`, labels at BPE paragraph breaks, a small top-N draft vocab over the big
target trained by Ray Train and loaded by vLLM, calibration, the Serve endpoint splitting the reasoning
with the `qwen3` parser and reporting usage telemetry, evaluation and report; the same JSON as the toy's.
The teacher-generic checks: tests/support/demo_checks.py."""

import pytest

from support.demo_checks import check_teacher_demo, run_teacher_demo

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=13)]


def test_qwen3_like_demo_quick(tmp_path):
    from specexit_core.teachers import qwen3_like as q3

    run = run_teacher_demo(tmp_path, "qwen3-like")
    a = check_teacher_demo(run, q3.SPEC)
    # Qwen3's template (thinking on): the prompt ends with the assistant header, the model opens <think>
    assert all(a.tok.decode(r["prompt_token_ids"]).endswith("<|im_end|>\n<|im_start|>assistant\n") for r in a.traces_ok)
    assert a.draft["draft_vocab_size"] == 192
