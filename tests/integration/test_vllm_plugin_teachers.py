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
not acceptance, is under test).

The same engine also shows that the teacher, materialised to its full-vocabulary checkpoint, runs in vLLM
as a plain target should: the zero-row LM head (vllm_plugin/zero_row_head.py) is installed and computes
exactly the non-zero rows, and the teacher's vLLM reasoning parser (`qwen3`, `deepseek_r1`) splits its
greedy thinking from its answer. A second test loads a converted published-style head through vLLM's own
EAGLE-3 config and weight loading (no engine)."""

import pytest

from specexit_core.exit import ExitConfig
from specexit_core.teachers.build import COMPACT_WEIGHTS
from specexit_core.teachers.registry import TEACHERS, get_teacher

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=2)]

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
        head_rows = llm.collective_rpc("specexit_head_rows")
        # effort `none` on a prompt that leaves thinking open (no `enable_thinking` in the R1 template):
        # `</think>` is the first generated token, the rest is the answer
        no_think = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(max_tokens=8, temperature=0, extra_args={"specexit_effort": "none"}),
            use_tqdm=False,
        )
    finally:
        llm.llm_engine.engine_core.shutdown()

    def ids(o):
        x = list(o.outputs[0].token_ids)
        return x[:-1] if x and x[-1] == tok.eos_token_id else x

    assert [ids(o) for o in off] == generate(model, tok, prompts, max_new_tokens=MAX_TOKENS)
    # the target's LM head is the zero-row head, and it is exact (the greedy tokens above)
    n_nonzero = int(model.get_output_embeddings().weight.ne(0).any(dim=1).sum())
    assert head_rows == [[n_nonzero, model.config.vocab_size]]
    check_reasoning_parser(t.spec, tok, [ids(o) for o in off])

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
    assert all(list(o.outputs[0].token_ids)[:1] == [close] for o in no_think)
    assert all(close not in list(o.outputs[0].token_ids)[1:] for o in no_think)


def check_reasoning_parser(spec, tok, completions: list[list[int]]) -> None:
    """The teacher's vLLM reasoning parser splits each well-formed greedy completion (a thinking closed by
    `</think>`, then an answer) into reasoning and content; a short-trained teacher may not close
    `</think>` on every problem within the limit (docs/teachers.md), but on some it does."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    from specexit_core.teachers.check import well_formed

    parser = ReasoningParserManager.get_reasoning_parser(spec.reasoning_parser)(tok)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "1 + 1"}])
    closed = [o for o in completions if well_formed(spec, o, tok)]
    assert closed, "no greedy completion closed its thinking"
    for o in closed:
        reasoning, content = parser.extract_reasoning(tok.decode(o, skip_special_tokens=True), req)
        assert reasoning and content and "</think>" not in content


def test_vllm_loads_a_converted_published_qwen3_head_for_qwen3_like(tmp_path_factory):
    """Issue 13 item 5: a head shaped like SpecForge's published Qwen3 heads, for qwen3-like (its
    vocabulary, its hidden size, aux layers named), converted with `specexit draft convert --add-signals
    --target`, goes through vLLM 0.32's own EAGLE-3 config and weight loading for the qwen3-like target
    and the plugin's load-time checks (`vllm_load_report`, in a subprocess). No engine: the engine
    of test_exit_and_tokens_match_the_reference_engine serves a converted head of random weights with its
    own aux layers; serving a trained converted head end to end is the toy's (docs/method.md). ~35 s of CPU, most of it vLLM inspecting
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
