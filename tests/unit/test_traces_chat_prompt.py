"""The traces stage's prompts: the chat template's text tokenized without added special tokens, as
the chat endpoint and the evaluation tokenize it, and as the built-in teachers were trained. Ray
Data's tokenize stage added them, so R1's template (which writes `<｜begin▁of▁sentence｜>` itself)
got two BOS tokens in every trace prompt; found by the r1-llama-like demo (issue #13 item 4)."""

from __future__ import annotations

import pytest

from pipelines.traces.job import build_trace_processor, chat_prompt
from specexit_core.teachers import qwen3_like, r1_llama_like
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems

PROBLEMS = list(problems("test", 5, seed=0))


def test_r1_prompt_has_one_bos_and_is_what_the_teacher_was_trained_on():
    spec = r1_llama_like.SPEC
    tok = spec.load_tokenizer()
    bos = tok.convert_tokens_to_ids(spec.bos_token)
    for p in PROBLEMS:
        text, ids = chat_prompt(tok, [{"role": "user", "content": p.prompt}])
        assert text == spec.chat_prompt(tok, p) and ids == spec.prompt_ids(tok, p)
        assert ids[0] == bos and ids.count(bos) == 1
        assert ids[-2:] == [spec.think_start_id, tok.encode("\n", add_special_tokens=False)[0]]
        assert tok(text)["input_ids"] == [bos, *ids]  # what Ray Data's tokenize stage gave


@pytest.mark.parametrize("which", ["toy", "qwen3-like"])
def test_templates_without_bos_keep_their_ids(which):
    """The toy's and Qwen3's templates write no BOS: the same ids as Ray Data's tokenize stage."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR)) if which == "toy" else qwen3_like.SPEC.load_tokenizer()
    for p in PROBLEMS:
        text, ids = chat_prompt(tok, [{"role": "user", "content": p.prompt}])
        assert ids == tok(text)["input_ids"]


def test_processor_sends_our_ids_not_ray_datas(tmp_path, monkeypatch):
    """The processor runs no chat-template or tokenize stage of its own; `preprocess` gives vLLM the
    prompt text and its ids (system prompt and chat_template_kwargs included)."""
    import ray.data.llm

    from pipelines.traces.config import TracesConfig

    seen = {}
    monkeypatch.setattr(ray.data.llm, "vLLMEngineProcessorConfig", lambda **kw: kw)
    monkeypatch.setattr(ray.data.llm, "build_processor", lambda cfg, **kw: seen.update(cfg=cfg, **kw))
    spec = qwen3_like.SPEC
    cfg = TracesConfig.model_validate(
        {
            "output": str(tmp_path / "out"),
            "input": {"kind": "toy"},
            "engine": {"model": str(spec.tokenizer_dir)},
            "system_prompt": "Be brief.",
            "chat_template_kwargs": {"enable_thinking": False},
            "sampling": {"temperature": 0.6, "seed": 0, "max_tokens": 7},
        }
    )
    build_trace_processor(cfg, gpu=False)
    assert seen["cfg"]["chat_template_stage"] is False and seen["cfg"]["tokenize_stage"] is False
    row = seen["preprocess"]({"id": "row-0", "input_prompt": PROBLEMS[0].prompt})
    tok = spec.load_tokenizer()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROBLEMS[0].prompt}]
    want = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert row["prompt"] == want and "<think>\n\n</think>\n\n" in want
    assert row["tokenized_prompt"] == tok.encode(want, add_special_tokens=False)
    assert row["sampling_params"]["max_tokens"] == 7 and "seed" in row["sampling_params"]
