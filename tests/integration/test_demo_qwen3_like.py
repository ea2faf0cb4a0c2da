"""`specexit demo --teacher qwen3-like --quick --json`: the whole loop on the built-in qwen3-like teacher
(Qwen3's real 151,936-id vocabulary and chat template). Mechanics, not accuracy: traces in Qwen3's
template that close `</think>`, labels at BPE paragraph breaks, a small top-N draft vocab over the big
target trained by Ray Train and loaded by vLLM, calibration, the Serve endpoint splitting the reasoning
with the `qwen3` parser and reporting usage telemetry, evaluation and report; the same JSON as the toy's.

The demo runs once (the module's `run`); each stage is checked by a test of its own reading its work
folder. The teacher-generic checks: tests/support/demo_checks.py."""

import json
import subprocess
import sys

import pytest

from support import demo_checks as dc
from support.paths import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=5.5)]


@pytest.fixture(scope="module")
def spec():
    from specexit_core.teachers import qwen3_like as q3

    return q3.SPEC


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return dc.run_teacher_demo(tmp_path_factory.mktemp("qwen3-like"), "qwen3-like")


def test_summary_json_and_every_stage(run, spec):
    dc.check_teacher_summary(run, spec)


def test_traces_in_qwen3s_template_the_model_opens_the_thinking(run, spec):
    ok = dc.check_teacher_traces(run, spec)
    # Qwen3's template (thinking on): the prompt ends with the assistant header, the model opens <think>
    tok = spec.load_tokenizer()
    assert all(tok.decode(r["prompt_token_ids"]).endswith("<|im_end|>\n<|im_start|>assistant\n") for r in ok)


def test_labels_at_bpe_paragraph_breaks(run, spec):
    dc.check_teacher_labels(run, spec)


def test_draft_top_n_vocab_over_the_full_vocabulary(run, spec):
    assert dc.check_teacher_draft(run, spec)["draft_vocab_size"] == 192


def test_endpoint_splits_the_reasoning_with_the_qwen3_parser(run, spec):
    dc.check_teacher_serve(run, spec)


def test_calibration_replay_matches_the_engine(run):
    """The model writes `<think>` itself here: the replay once counted it as a think token."""
    dc.check_replay_matches_the_engine(run.wd)


def test_exit_headroom_script_on_the_run(run):
    """studies/exit_headroom.py on the run: the calibrated exit replayed on the test traces, the
    test-chosen bound, the bigger-dev check (docs/teachers.md "How far any exit could go")."""
    out = subprocess.run(
        [sys.executable, "studies/exit_headroom.py", str(run.wd), "qwen3_like", "--splits", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    head = json.loads(out.stdout)
    assert set(head["problems"]["test"]) == {"0.0"} and head["bigger_dev"]["splits"] == 1
    cal, best = head["calibrated"]["0.0"], head["best_on_test"]["0.0"]
    assert cal["think_tokens"] > 0 and best["think_tokens"] > 0
    if cal["accuracy_vs_eagle3_points"] >= -100 * head["tolerance"]:  # the dev choice qualifies on test too:
        assert best["think_tokens"] <= cal["think_tokens"]  # the rule picked on test thinks no more than it
    losses = head["calibrated_losses"]["0.0"]
    assert 0 <= losses["exit_probe_also_wrong"] <= losses["lost_vs_eagle3"] <= head["problems"]["test"]["0.0"]
