"""`specexit demo --teacher r1-llama-like --quick --json`: the whole loop on the built-in r1-llama-like
teacher (DeepSeek-R1-Distill-Llama's 128,256-id vocabulary and chat template). Mechanics, not accuracy
(the teacher's first build answers 0.21 of the test split): the same checks as qwen3-like's
(tests/support/demo_checks.py), plus R1's template shape: the generation prompt opens the thinking
(`<｜Assistant｜><think>\\n`), so the completions never write `<think>` but close `</think>`; the
labels sit at Llama 3's single-token paragraph breaks; the endpoint's `deepseek_r1` parser returns the
reasoning and the answer apart. Its own module, so that pytest-xdist (`loadfile`) runs it beside
qwen3-like's."""

import pytest

from support.demo_checks import check_teacher_demo, run_teacher_demo

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=9)]


def test_r1_llama_like_demo_quick(tmp_path):
    from specexit_core.teachers import r1_llama_like as r1

    run = run_teacher_demo(tmp_path, "r1-llama-like")
    a = check_teacher_demo(run, r1.SPEC)
    # R1's template: the generation prompt itself opens the thinking
    prompts = [a.tok.decode(r["prompt_token_ids"]) for r in a.traces_ok]
    assert all(p.startswith("<｜begin▁of▁sentence｜><｜User｜>") for p in prompts)
    assert all(p.endswith("<｜Assistant｜><think>\n") for p in prompts)
    assert all(
        r["prompt_token_ids"][-2:] == [r1.THINK_START_ID, a.tok.encode("\n", add_special_tokens=False)[0]]
        for r in a.traces_ok
    )
    # ... so a completion is thinking text, never a second <think>, closed by </think>
    comps = [r["completion_token_ids"] for r in a.traces_ok]
    assert all(r1.THINK_START_ID not in c for c in comps)
    assert any(r1.THINK_END_ID in c for c in comps)
    assert all("<think>" not in r["completion_text"] for r in a.traces_ok)
    # labels: Llama 3's paragraph breaks, merged with punctuation as in Qwen3 (".\n\n" is id 382)
    assert a.tok.convert_tokens_to_ids(a.tok.tokenize(".\n\n")) == [382] and ".\n\n" in a.breaks
    # the draft: a top-256 vocab over Llama's 128,256 rows (the traces use ~190 ids: every number is one)
    assert a.draft["vocab_size"] == 128256 and a.draft["draft_vocab_size"] == 256
    # the endpoint: deepseek_r1 split each closed thinking into reasoning (no tags) and the answer
    for r in a.serve["rows"]:
        assert "<think>" not in r["reasoning"] and "</think>" not in r["reasoning"]
        if r["answer"]:
            assert "<think>" not in r["answer"] and "</think>" not in r["answer"]
