"""The vLLM plugin against the reference engine on each shipped built-in teacher (qwen3-like,
r1-llama-like: 151,936 / 128,256-id vocabularies, their templates, Qwen3 / Llama architectures), as
test_vllm_plugin.py does on the toy (issue 13 item 4).

The draft is a head shaped like the published ones of the teacher's family (test_draft_public_heads_
teachers.published_head: random weights, a small draft vocabulary with d2t), converted with
`specexit draft convert --add-signals --target` (zero signal rows: confidence 0.5, progress 0.5,
remaining 0, exactly, in both engines). So the exit is fixed by the text alone: with `remain` below
100 and `min_think_tokens` 24, at the first paragraph break from the 24th think token on. Both
engines must stop there, at the same token, and give the same greedy tokens; with SpecExit off vLLM
gives transformers' greedy tokens (a random draft is rejected almost always: lossless verification,
not acceptance, is under test)."""

import pytest

from specexit_core.exit import ExitConfig
from specexit_core.teachers.build import COMPACT_WEIGHTS
from specexit_core.teachers.registry import TEACHERS, get_teacher

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=4)]

N_PROMPTS = 6
MAX_TOKENS = 160
EXIT = {"method": "remain", "remaining_threshold": 100.0, "min_think_tokens": 24}


@pytest.fixture(scope="module", params=sorted(TEACHERS))
def setup(request, tmp_path_factory, telemetry_dir):
    """(teacher facts, the converted SpecExit draft folder, prompts) of one shipped teacher."""
    from specexit_app.cli import main as cli_main
    from specexit_core.teachers.materialize import materialize
    from specexit_core.toy.task import problems
    from tests.unit.test_draft_public_heads_teachers import NAMED_LAYERS, published_head, teacher_facts

    spec = get_teacher(request.param)
    if not (spec.assets_dir / COMPACT_WEIGHTS).exists():
        pytest.skip(f"{spec.name} not built yet: no {spec.assets_dir / COMPACT_WEIGHTS}")
    tmp = tmp_path_factory.mktemp(spec.name)
    t = teacher_facts(spec.name, materialize(spec, out=tmp / "target"))
    head = published_head(t, tmp / "head", aux_layers=NAMED_LAYERS)
    draft = tmp / "specexit"
    assert cli_main(["draft", "convert", str(head), str(draft), "--add-signals", "--target", str(t.dir)]) == 0
    prompts = [spec.prompt_ids(t.tok, p) for p in problems("test", N_PROMPTS, seed=31)]
    return t, draft, prompts


def test_exit_and_tokens_match_the_reference_engine(setup, telemetry_dir):
    from vllm import SamplingParams

    from specexit_core.draft.checkpoint import load_draft
    from specexit_core.engine.reference import ReferenceEngine
    from specexit_core.engine.types import GenerationRequest
    from specexit_core.toy.hf_generate import generate, load_teacher
    from specexit_core.toy.vllm_generate import make_llm
    from specexit_core.vllm_plugin.telemetry import read_exit_events, request_telemetry

    t, draft_dir, prompts = setup
    for f in telemetry_dir.iterdir():  # the other teacher's engine numbered its requests the same way
        f.unlink()
    model, tok = load_teacher(t.dir)
    spec_cfg = {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": 3}
    llm = make_llm(t.dir, max_model_len=1024, max_num_seqs=N_PROMPTS, speculative_config=spec_cfg)
    try:
        xargs = {f"specexit_{k}": v for k, v in EXIT.items()}
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(max_tokens=MAX_TOKENS, temperature=0, extra_args=xargs),
            use_tqdm=False,
        )
        off = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(max_tokens=MAX_TOKENS, temperature=0, extra_args={"specexit": False}),
            use_tqdm=False,
        )
    finally:
        llm.llm_engine.engine_core.shutdown()

    def ids(o):
        x = list(o.outputs[0].token_ids)
        return x[:-1] if x and x[-1] == tok.eos_token_id else x

    assert [ids(o) for o in off] == generate(model, tok, prompts, max_new_tokens=MAX_TOKENS)

    draft = load_draft(draft_dir, target_embed=model.get_input_embeddings().weight.detach())
    ref = ReferenceEngine(model, tok, draft, num_speculative_tokens=3).generate(
        [GenerationRequest(p, max_tokens=MAX_TOKENS, exit=ExitConfig(**EXIT)) for p in prompts]
    )
    events = read_exit_events(telemetry_dir)
    close = tok.convert_tokens_to_ids("</think>")
    exits = 0
    for o, r in zip(outs, ref, strict=True):
        tel = request_telemetry(o, events, close)
        assert ids(o) == r.token_ids
        assert tel["exit_index"] == (r.exit.index if r.exit else None)
        if r.exit:
            exits += 1
            assert r.exit.think_tokens >= EXIT["min_think_tokens"] and r.token_ids[r.exit.index + 1] == close
            assert tel["smoothed"] == {"confidence": 0.5, "progress": 0.5, "remaining": 0.0}
    assert exits >= N_PROMPTS // 2
