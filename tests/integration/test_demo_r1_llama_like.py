"""`specexit demo --teacher r1-llama-like --quick --json`: the whole loop on the built-in r1-llama-like
teacher (DeepSeek-R1-Distill-Llama's 128,256-id vocabulary and chat template). Mechanics, not accuracy
(the teacher's first build answers 0.21 of the test split): the same checks as qwen3-like's
(tests/support/demo_checks.py), plus R1's template shape: the generation prompt opens the thinking
(`<｜Assistant｜><think>\\n`), so the completions never write `<think>` but close `</think>`; the
labels sit at Llama 3's single-token paragraph breaks; the endpoint's `deepseek_r1` parser returns the
reasoning and the answer apart. Its own module, so that pytest-xdist (`loadfile`) runs it beside
qwen3-like's. The demo runs once (the module's `run`); each stage is checked by a test of its own."""

import pytest

from support import demo_checks as dc

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=5.5)]


@pytest.fixture(scope="module")
def spec():
    from specexit_core.teachers import r1_llama_like as r1

    return r1.SPEC


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return dc.run_teacher_demo(tmp_path_factory.mktemp("r1-llama-like"), "r1-llama-like")


def test_summary_json_and_every_stage(run, spec):
    dc.check_teacher_summary(run, spec)


def test_traces_r1s_prompt_opens_the_thinking(run, spec):
    ok = dc.check_teacher_traces(run, spec)
    tok = spec.load_tokenizer()
    prompts = [tok.decode(r["prompt_token_ids"]) for r in ok]
    assert all(p.startswith("<｜begin▁of▁sentence｜><｜User｜>") for p in prompts)
    assert all(p.endswith("<｜Assistant｜><think>\n") for p in prompts)
    newline = tok.encode("\n", add_special_tokens=False)[0]
    assert all(r["prompt_token_ids"][-2:] == [spec.think_start_id, newline] for r in ok)
    # ... so a completion is thinking text, never a second <think>, closed by </think>
    comps = [r["completion_token_ids"] for r in ok]
    assert all(spec.think_start_id not in c for c in comps)
    assert any(spec.think_end_id in c for c in comps)
    assert all("<think>" not in r["completion_text"] for r in ok)


def test_labels_at_llama3s_paragraph_breaks(run, spec):
    breaks = dc.check_teacher_labels(run, spec)
    # Llama 3's paragraph breaks, merged with punctuation as in Qwen3 (".\n\n" is id 382)
    tok = spec.load_tokenizer()
    assert tok.convert_tokens_to_ids(tok.tokenize(".\n\n")) == [382] and ".\n\n" in breaks


def test_draft_top_n_vocab_over_llamas_rows(run, spec):
    # a top-256 vocab over Llama's 128,256 rows (the traces use ~190 ids: every number is one)
    draft = dc.check_teacher_draft(run, spec)
    assert draft["vocab_size"] == 128256 and draft["draft_vocab_size"] == 256


def test_endpoint_splits_the_reasoning_with_the_deepseek_r1_parser(run, spec):
    serve = dc.check_teacher_serve(run, spec)
    for r in serve["rows"]:
        assert "<think>" not in r["reasoning"] and "</think>" not in r["reasoning"]
        if r["answer"]:
            assert "<think>" not in r["answer"] and "</think>" not in r["answer"]


def test_calibration_replay_matches_the_engine(run):
    dc.check_replay_matches_the_engine(run.wd)
