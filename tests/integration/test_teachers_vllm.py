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
        head_rows = llm.collective_rpc("specexit_head_rows")
    finally:
        del llm
    assert vl == hf  # with the zero-row LM head (vllm_plugin/zero_row_head.py): it is exact
    n_nonzero = int(model.get_output_embeddings().weight.ne(0).any(dim=1).sum())
    assert head_rows == [[n_nonzero, model.config.vocab_size]]

    # a short-trained teacher may not close </think> on every problem within the limit (docs/teachers.md)
    parser = ReasoningParserManager.get_reasoning_parser(spec.reasoning_parser)(tok)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": ps[0].prompt}])
    for o in (o for o in vl if well_formed(spec, o, tok)):
        reasoning, content = parser.extract_reasoning(tok.decode(o, skip_special_tokens=True), req)
        assert reasoning and content and "</think>" not in content
    return vl


def test_vllm_loads_a_converted_published_qwen3_head_for_qwen3_like(tmp_path_factory):
    """Issue 13 item 5: a head shaped like SpecForge's published Qwen3 heads, for qwen3-like (its
    vocabulary, its hidden size, aux layers named), converted with `specexit draft convert --add-signals
    --target`, goes through vLLM 0.32's own EAGLE-3 config and weight loading for the qwen3-like target
    and the plugin's load-time checks (`vllm_load_report`, in a subprocess). No engine: the engine
    above serves the teacher alone (speculative decoding is fixed when an engine starts), and serving a
    converted head end to end is the toy's (docs/method.md). ~35 s of CPU, most of it vLLM inspecting
    the two model classes in subprocesses with the session's cold cache."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from specexit_app.cli import main as cli_main
    from specexit_core.draft.checkpoint import read_config
    from specexit_core.draft.config import SPECEXIT_ARCH
    from specexit_core.teachers.materialize import materialize
    from tests.unit.test_draft_public_heads_teachers import NAMED_LAYERS, THINK_END, published_head, teacher_facts

    spec = get_teacher("qwen3-like")
    if not (spec.assets_dir / COMPACT_WEIGHTS).exists():
        pytest.skip(f"{spec.name} not built yet: no {spec.assets_dir / COMPACT_WEIGHTS}")
    tmp = tmp_path_factory.mktemp("qwen3-head")
    t = teacher_facts(spec.name, materialize(spec, out=tmp / "target"))
    head = published_head(t, tmp / "head", aux_layers=NAMED_LAYERS)
    out = tmp / "se"
    assert cli_main(["draft", "convert", str(head), str(out), "--add-signals", "--target", str(t.dir)]) == 0
    code = (
        "import json, sys; from tests.unit.test_draft_public_heads_teachers import vllm_load_report as f; "
        "print('REPORT ' + json.dumps(f(*sys.argv[1:])))"
    )
    args = [sys.executable, "-c", code, str(t.dir), str(out), str(tmp / "pg")]
    run = subprocess.run(
        args, cwd=Path(__file__).parents[2], env={**os.environ}, capture_output=True, text=True, timeout=300
    )
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("REPORT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    ids = read_config(out).token_ids
    assert json.loads(lines[-1][len("REPORT ") :]) == {
        "arch": SPECEXIT_ARCH,
        "cls": "SpecExitEagle3LlamaForCausalLM",
        "aux": NAMED_LAYERS,  # what vLLM's V1 runner takes from the converted config
        "target_layers": 4,
        "fc": True,  # vLLM's fc holds the head's rows and the 3 signal rows
        "signal_rows_zero": True,
        "lm_head": True,
        "d2t": True,  # d2t -> draft_id_to_target_id; t2d skipped
        "has_own_embed_tokens": False,  # vLLM shares the target's, as for the published head
        "token_ids": [ids["think_start"], THINK_END["qwen3-like"], sorted(ids["split"])],
    }
