"""Each shipped built-in teacher (qwen3-like, r1-llama-like), materialised to its full-vocabulary
checkpoint, in a real vLLM engine (CPU build): it loads, generates the same greedy tokens as
transformers, and the teacher's vLLM reasoning parser (`qwen3`, `deepseek_r1`) splits its thinking
from its answer. No training here (the weights are shipped); a teacher not built yet is skipped."""

import pytest

from specexit_core.teachers.build import COMPACT_WEIGHTS
from specexit_core.teachers.check import well_formed
from specexit_core.teachers.registry import TEACHERS, get_teacher
from specexit_core.toy.hf_generate import generate, load_teacher
from specexit_core.toy.task import problems

pytestmark = pytest.mark.vllm

MAX_TOKENS = 200


@pytest.fixture(params=sorted(TEACHERS))
def teacher(request, tmp_path_factory):
    """(spec, the materialised folder) of one shipped teacher."""
    from specexit_core.teachers.materialize import materialize

    spec = get_teacher(request.param)
    if not (spec.assets_dir / COMPACT_WEIGHTS).exists():
        pytest.skip(f"{spec.name} not built yet: no {spec.assets_dir / COMPACT_WEIGHTS}")
    return spec, materialize(spec, out=tmp_path_factory.mktemp(spec.name))


def test_vllm_matches_transformers_and_the_parser_splits_reasoning(teacher):
    spec, full_dir = teacher
    check_in_vllm(spec, full_dir)


def check_in_vllm(spec, full_dir, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """The test's body (also run by hand on a tiny build's folder); returns vLLM's completions."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    from specexit_core.toy.vllm_generate import make_llm, vllm_generate

    model, tok = load_teacher(full_dir)
    ps = problems("test", 4, seed=11)
    prompts = [spec.prompt_ids(tok, p) for p in ps]
    hf = generate(model, tok, prompts, max_new_tokens=max_tokens)
    llm = make_llm(full_dir, max_model_len=1024, max_num_seqs=4)
    try:
        vl = vllm_generate(llm, prompts, max_tokens=max_tokens)
    finally:
        del llm
    assert vl == hf

    # a short-trained teacher may not close </think> on every problem within the limit (docs/teachers.md)
    parser = ReasoningParserManager.get_reasoning_parser(spec.reasoning_parser)(tok)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": ps[0].prompt}])
    for o in (o for o in vl if well_formed(spec, o, tok)):
        reasoning, content = parser.extract_reasoning(tok.decode(o, skip_special_tokens=True), req)
        assert reasoning and content and "</think>" not in content
    return vl
