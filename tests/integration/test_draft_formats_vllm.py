"""Issue 41 item 2 on the vLLM CPU engine: a head in each layout and layer vLLM 0.32 runs (docs/draft_formats.md)
drafts the same tokens in the SpecExit drafter as in vLLM's own. For each variant: the head as vLLM loads it
(no plugin class involved: its own Eagle3 Llama / Qwen3 drafter; the head as `--strip-signals` gives it back,
tensor for tensor), and the same head converted with
`specexit draft convert --add-signals` (same layout) served with the signals never firing (a speculators one
given to vLLM as the model folder itself, as `vllm serve FOLDER` does: vLLM serves the verifier it names,
`--target`, with it as the draft, on the SpecExit drafter the plugin keeps it on). Both give the
same greedy tokens as plain decoding (transformers on the toy teacher) and the same accepted-token count;
the PyTorch draft training and the reference engine use (SpecExitDraft, loaded from the converted folder)
accepts the same drafts too, within float rounding.

The heads are the shipped toy draft's trained weights with the variant's options switched on (its new
norms at unit gain), so drafts are accepted often enough for the count to be a real check."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specexit_app.bench.spec_counters import attach
from specexit_app.bench.vllm_bench import engine_kwargs
from specexit_core.draft import formats
from specexit_core.draft.checkpoint import convert, load_draft
from specexit_core.draft.config import DraftConfig
from specexit_core.draft.for_target import convert_for_target
from specexit_core.draft.model import expected_shapes
from specexit_core.draft.weights import read_tensors
from specexit_core.engine.reference import ReferenceEngine
from specexit_core.engine.types import GenerationRequest
from specexit_core.exit import NEVER_FIRES, ExitConfig
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from specexit_core.toy.task import problems
from specexit_core.toy.teacher_eval import prompt_ids
from specexit_core.vllm_env import apply_cpu_defaults

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=2.5)]
MAX_TOKENS = 128
# the signals never fire, and no answer reserve closes a long thinking (plain decoding runs to MAX_TOKENS)
NEVER = {"specexit": {**NEVER_FIRES, "answer_reserve_tokens": 0}}
N_PROMPTS = 6
VARIANTS = {  # layout, then what the head's config says
    "speculators-llama": (formats.SPECULATORS, {"norm_before_residual": True}),
    "speculators-qwen3": (formats.SPECULATORS, {"layer": "qwen3", "norm_output": True}),
    "flat-llama-fc-norms": (formats.FLAT, {"norm_before_fc": True, "fc_norm": True}),
}


def variant_head(folder, fmt: str, options: dict):
    """The shipped draft without its signal rows, with `options` on, written in layout `fmt`."""
    stock = convert(DRAFT_DIR, folder / "stock", add_signals=False)
    cfg = DraftConfig.from_hf_json(json.loads((stock / "config.json").read_text())).replace(**options)
    tensors = read_tensors(stock, cfg.replace(layer="llama", norm_before_fc=False, fc_norm=False))
    for name, shape in expected_shapes(cfg).items():  # the variant's own norms, at unit gain
        if name not in tensors and name != "embed_tokens.weight":
            tensors[name] = torch.ones(shape)
    flat = cfg.to_hf_json()
    if fmt == formats.SPECULATORS:
        flat = formats.speculators_json(flat, verifier=str(TEACHER_DIR))
        tensors = formats.speculators_tensor_names(tensors)
    head = folder / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps(flat, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(head / "model.safetensors"))
    return head


def serve(draft, prompts, *, direct: bool = False) -> tuple[list[list[int]], int]:
    """Greedy token ids of every prompt and the drafts accepted, on an engine of its own. `direct`: the
    draft folder is the engine's model (`vllm serve FOLDER` for a speculators-layout draft: vLLM serves its
    verifier with it), else the toy teacher with the draft as its speculative model."""
    from vllm import LLM, SamplingParams

    kwargs = engine_kwargs(draft, 3)
    if direct:
        kwargs = {**{k: v for k, v in kwargs.items() if k != "speculative_config"}, "model": str(draft)}
    llm = LLM(**kwargs)
    try:
        counters = attach(llm)
        sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, extra_args=NEVER)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs], counters.accepted
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def prompts_and_plain(teacher):
    from specexit_core.toy.hf_generate import generate

    model, tok = teacher
    prompts = [prompt_ids(tok, p) for p in problems("test", N_PROMPTS, seed=41)]
    plain = generate(model, tok, prompts, max_new_tokens=MAX_TOKENS)
    return prompts, [ids + [tok.eos_token_id] if len(ids) < MAX_TOKENS else ids for ids in plain]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_specexit_drafter_drafts_what_vllms_own_drafter_drafts(name, tmp_path, prompts_and_plain, teacher):
    apply_cpu_defaults()
    fmt, options = VARIANTS[name]
    prompts, plain = prompts_and_plain
    head = variant_head(tmp_path, fmt, options)
    spec = convert_for_target(head, tmp_path / "specexit", add_signals=True, target=TEACHER_DIR, fmt=fmt)
    assert formats.format_of(json.loads((spec / "config.json").read_text())) == fmt
    # the way back (--strip-signals, same layout): the head again, which vLLM serves on its own drafter
    back = convert_for_target(spec, tmp_path / "back", add_signals=False, target=TEACHER_DIR, fmt=fmt)
    head_t, back_t = load_file(str(head / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert head_t.keys() == back_t.keys() and all(torch.equal(head_t[k], back_t[k]) for k in head_t)
    stock_ids, stock_accepted = serve(back, prompts)
    # a speculators-layout SpecExit draft is served as `vllm serve FOLDER` would: the folder names its target
    spec_ids, spec_accepted = serve(spec, prompts, direct=fmt == formats.SPECULATORS)
    assert stock_ids == plain  # vLLM's own drafter: lossless, as speculative decoding must be
    assert spec_ids == plain
    print(f"{name}: accepted {stock_accepted} (vLLM's drafter) vs {spec_accepted} (SpecExit's)")
    assert spec_accepted == stock_accepted > 0
    model, tok = teacher
    ref = ReferenceEngine(model, tok, load_draft(spec), num_speculative_tokens=3)
    exit_off = ExitConfig(**NEVER["specexit"])
    outs = ref.generate([GenerationRequest(p, max_tokens=MAX_TOKENS, exit=exit_off) for p in prompts])
    ref_accepted = sum(o.stats.accepted for o in outs)
    print(f"{name}: the PyTorch draft (reference engine) accepted {ref_accepted}")
    assert [o.token_ids for o in outs] == [[t for t in ids if t != tok.eos_token_id] for ids in plain]
    assert abs(ref_accepted - stock_accepted) <= 0.02 * stock_accepted
