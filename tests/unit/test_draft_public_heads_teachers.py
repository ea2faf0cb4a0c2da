"""Issue 13 item 5 on the realistic built-in teachers (docs/method.md, "Starting from a public EAGLE-3
head"): a head shaped like the published ones for the teacher's family imports as a SpecExit draft
(`init_draft:` in train_draft, `specexit draft convert --add-signals --target`), and the draft
train_draft builds for the teacher exports with the published tensor names and config keys.

- `qwen3-like` (Qwen3ForCausalLM, 151,936 ids) <-> SpecForge's `configs/qwen3-4b-eagle3.json` keys:
  `LlamaForCausalLMEagle3`, Qwen3's own keys (`max_window_layers`, `use_sliding_window`,
  `rope_theta: 1000000`, `head_dim`, `tie_word_embeddings: true`), `draft_vocab_size`, no aux ids,
  `model.safetensors`.
- `r1-llama-like` (LlamaForCausalLM, 128,256 ids) <-> yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config
  (= SpecForge `configs/llama3-8B-eagle3.json` with the EAGLE authors' architecture name
  `LlamaForCausalLM`): no head_dim, no rope_theta, no aux ids, `pytorch_model.bin` with `d2t`/`t2d`.

Each is scaled to the teacher's size (hidden 256, 4 heads, 2 KV heads, intermediate 768) with the
teacher's full vocabulary and a 256-id draft vocabulary. The teachers have 4 decoder layers, under
the 7 that vLLM's default aux layers (2, L // 2, L - 3) need: a head naming no layers is refused
with that reason, and the same head naming its layers (as SpecForge / AQ-MedAI heads do, in
`eagle_config`) imports. No Ray, no vLLM engine: the vLLM side is the plugin's own load-time checks
(both teachers); `vllm_load_report` (vLLM's own EAGLE-3 config and weight loader on a converted head) is
run for qwen3-like by tests/integration/test_vllm_plugin_teachers.py (~35 s of CPU with vLLM's cold caches).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from specexit_app.cli import main as cli_main
from specexit_core.draft.checkpoint import convert, load_draft, read_config, save_draft
from specexit_core.draft.config import SPECEXIT_ARCH, STOCK_ARCH, DraftConfig
from specexit_core.draft.model import expected_shapes
from specexit_core.exit import SIGNALS
from specexit_core.teachers.registry import get_teacher

N = 256  # draft vocab (published heads: 32,000 of the target's 128,256 / 151,936)
THINK_END = {"qwen3-like": 151668, "r1-llama-like": 128014}  # the real tokenizers' </think>
FAMILY = {"qwen3-like": "qwen3", "r1-llama-like": "llama31"}
NAMED_LAYERS = [1, 2, 3]  # what examples/*/train_draft.yaml name for these 4-layer targets

# SpecForge configs/qwen3-4b-eagle3.json, every key, sizes scaled to the teacher
QWEN3_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 64,  # published: 80 (Qwen3-4B: 2560 / 32 heads)
    "hidden_act": "silu",
    "hidden_size": 256,  # published: 2560
    "initializer_range": 0.02,
    "intermediate_size": 768,  # published: 9728
    "max_position_embeddings": 40960,
    "max_window_layers": 4,  # published: 36, the target's layer count
    "model_type": "llama",
    "num_attention_heads": 4,  # published: 32
    "num_hidden_layers": 1,
    "num_key_value_heads": 2,  # published: 8
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
    "draft_vocab_size": N,  # published: 32000
}
# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json, every key, sizes scaled to the teacher
LLAMA31_HEAD = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 256,  # published: 4096
    "initializer_range": 0.02,
    "intermediate_size": 768,  # published: 14336
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 4,  # published: 32
    "num_key_value_heads": 2,  # published: 8
    "num_hidden_layers": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.28.1",
    "use_cache": True,
    "vocab_size": 128256,
    "draft_vocab_size": N,  # published: 32000
}
PUBLISHED = {"qwen3": (QWEN3_HEAD, "safetensors", torch.bfloat16), "llama31": (LLAMA31_HEAD, "bin", torch.float16)}
# Published tensor names and shapes (docs/method.md; vLLM llama_eagle3.py load_weights), H = the
# drafter's hidden size, Ht = the target's, A / KV = attention / KV heads x head_dim, I = intermediate,
# N / V = draft / target vocab. `embed_tokens.weight [V, H]` is optional (else vLLM shares the target's).
PUBLISHED_SHAPES = {
    "fc.weight": ("H", "3Ht"),
    "midlayer.hidden_norm.weight": ("H",),
    "midlayer.input_layernorm.weight": ("H",),
    "midlayer.post_attention_layernorm.weight": ("H",),
    "midlayer.self_attn.q_proj.weight": ("A", "2H"),
    "midlayer.self_attn.k_proj.weight": ("KV", "2H"),
    "midlayer.self_attn.v_proj.weight": ("KV", "2H"),
    "midlayer.self_attn.o_proj.weight": ("H", "A"),
    "midlayer.mlp.gate_proj.weight": ("I", "H"),
    "midlayer.mlp.up_proj.weight": ("I", "H"),
    "midlayer.mlp.down_proj.weight": ("H", "I"),
    "norm.weight": ("H",),
    "lm_head.weight": ("N", "H"),
    "d2t": ("N",),
    "t2d": ("V",),
}
# The config keys a published-head loader reads (vLLM's Eagle3 drafter, SpecForge's
# LlamaForCausalLMEagle3): both families' configs have them, so our export must too.
LOADER_KEYS = {
    "architectures",
    "model_type",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "num_hidden_layers",
    "vocab_size",
    "draft_vocab_size",
    "rms_norm_eps",
    "max_position_embeddings",
    "hidden_act",
    "tie_word_embeddings",
    "torch_dtype",
}


def published_dims(cfg: DraftConfig) -> dict[str, int]:
    h, ht = cfg.hidden_size, cfg.target_hidden_size
    return {
        "H": h,
        "3Ht": 3 * ht,
        "2H": 2 * h,
        "A": cfg.num_attention_heads * cfg.head_dim,
        "KV": cfg.num_key_value_heads * cfg.head_dim,
        "I": cfg.intermediate_size,
        "N": cfg.draft_vocab_size,
        "V": cfg.vocab_size,
    }


def teacher_facts(name: str, target: Path) -> SimpleNamespace:
    """Teacher `name` materialised at `target`, with its tokenizer and the exit's token ids as
    train_draft takes them (pipelines/common/tokens.py)."""
    from transformers import AutoTokenizer

    from pipelines.common.tokens import token_ids

    tok = AutoTokenizer.from_pretrained(str(target))
    return SimpleNamespace(
        name=name,
        spec=get_teacher(name),
        dir=target,
        hf=json.loads((target / "config.json").read_text()),
        tok=tok,
        tids=token_ids(tok, think_start="<think>", think_end="</think>", model_dir=str(target)),
        embed=load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"].float(),
    )


@pytest.fixture(scope="module", params=["qwen3-like", "r1-llama-like"])
def teacher(request, tmp_path_factory):
    """`teacher_facts` of the teacher materialised as `teacher:NAME` resolves it (in a temp
    SPECEXIT_TEACHERS_DIR)."""
    from specexit_core.teachers.materialize import CACHE_ENV
    from specexit_core.teachers.model_ref import teacher_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("teachers")))
        target = Path(teacher_model(f"teacher:{request.param}"))
    return teacher_facts(request.param, target)


def draft_vocab(t) -> torch.Tensor:
    """N sorted target ids: what the exit needs (</think>, EOS, "\\n\\n"), the rest seeded at random."""
    must = {t.tids.think_start, t.tids.think_end, *t.tids.eos, t.tok.encode("\n\n", add_special_tokens=False)[0]}
    g = torch.Generator().manual_seed(0)
    rest = [int(i) for i in torch.randperm(t.spec.full_vocab_size, generator=g) if int(i) not in must]
    return torch.tensor(sorted([*must, *rest[: N - len(must)]]))


def published_head(t, folder: Path, *, aux_layers: list[int] | None = None) -> Path:
    """A head for teacher `t` shaped like the published ones of its family (config keys, tensor names,
    file format, dtype); `aux_layers`: named in `eagle_config` only, as SpecForge / AQ-MedAI heads do."""
    config, fmt, dtype = PUBLISHED[FAMILY[t.name]]
    config = dict(config)
    if aux_layers is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_layers, "use_aux_hidden_state": True}
    assert config["vocab_size"] == t.hf["vocab_size"] == t.spec.full_vocab_size and config["vocab_size"] > N
    assert config["hidden_size"] == t.hf["hidden_size"]
    cfg = DraftConfig.from_hf_json(config, target_num_layers=7)  # any valid count: only the shapes matter here
    torch.manual_seed(0)
    skip = ("embed_tokens.weight", "d2t", "t2d")  # no embed_tokens: vLLM shares the target's
    sd = {k: (torch.randn(shape) * 0.05).to(dtype) for k, shape in expected_shapes(cfg).items() if k not in skip}
    ids = draft_vocab(t)
    sd["d2t"] = ids - torch.arange(N)
    sd["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    sd["t2d"][ids] = True
    assert set(sd) == set(PUBLISHED_SHAPES)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if fmt == "bin":
        torch.save(sd, folder / "pytorch_model.bin")
    else:
        save_file(sd, str(folder / "model.safetensors"))
    return folder


def assert_published_layout(tensors: dict[str, torch.Tensor], cfg: DraftConfig, *, signal_rows: int = 0) -> None:
    """Tensor names and shapes as published heads have them; `signal_rows`: SpecExit's 3 extra fc rows."""
    dims = published_dims(cfg)
    assert set(tensors) - {"embed_tokens.weight"} == set(PUBLISHED_SHAPES), sorted(tensors)
    for name, pattern in PUBLISHED_SHAPES.items():
        want = tuple(dims[p] for p in pattern)
        if name == "fc.weight":
            want = (want[0] + signal_rows, want[1])
        assert tuple(tensors[name].shape) == want, (name, tuple(tensors[name].shape), want)
    if "embed_tokens.weight" in tensors:
        assert tuple(tensors["embed_tokens.weight"].shape) == (dims["V"], dims["H"])
    d2t, t2d = tensors["d2t"].long(), tensors["t2d"].bool()
    assert tensors["t2d"].dtype == torch.bool and int(t2d.sum()) == cfg.draft_vocab_size
    assert t2d[torch.arange(cfg.draft_vocab_size) + d2t].all()  # d2t lands on the ids t2d marks


def assert_vocab_maps(folder: Path, head: Path, t) -> None:
    """The converted draft's d2t / t2d are the head's, consistent, and keep the exit's tokens."""
    got, src = load_file(str(folder / "model.safetensors")), head_tensors(head)
    assert torch.equal(got["d2t"].long(), src["d2t"].long()) and torch.equal(got["t2d"].bool(), src["t2d"].bool())
    d2t, t2d = got["d2t"].long(), got["t2d"].bool()
    assert torch.equal(torch.nonzero(t2d).flatten(), torch.arange(N) + d2t)
    assert all(bool(t2d[i]) for i in (t.tids.think_end, *t.tids.eos))


def head_tensors(head: Path) -> dict[str, torch.Tensor]:
    from specexit_core.draft.weights import read_weight_files

    return read_weight_files(head)


# -- import: a published-shaped head for the teacher becomes a SpecExit draft ---------------------------


def test_teacher_facts(teacher):
    """What the rest relies on: the real tokenizers' ids and the teachers' 4 layers."""
    assert teacher.tids.think_end == THINK_END[teacher.name] == teacher.spec.think_end_id
    assert teacher.tids.think_start == teacher.spec.think_start_id
    assert teacher.hf["num_hidden_layers"] == 4 and teacher.hf["vocab_size"] == teacher.spec.full_vocab_size
    for brk in ("\n\n", ".\n\n"):  # every blank-line token (split_token_ids), merged ones too
        assert teacher.tok.encode(brk, add_special_tokens=False)[0] in teacher.tids.split


def test_a_head_naming_no_layers_is_refused_for_a_4_layer_teacher(teacher, tmp_path, capsys):
    """vLLM would feed such a head layers (2, 2, 1) of a 4-layer target (a repeated layer): both
    entry points refuse it, saying why and what to do."""
    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.job import prepare_init_draft

    head = published_head(teacher, tmp_path / "head")
    why = r"vLLM's default EAGLE-3 layers \(2, 2, 1\) are invalid for a 4-layer target; name the layers"
    out = tmp_path / "se"
    assert cli_main(["draft", "convert", str(head), str(out), "--add-signals", "--target", str(teacher.dir)]) == 2
    err = capsys.readouterr().err
    assert "invalid for a 4-layer target" in err and "eagle_aux_hidden_state_layer_ids" in err and not out.exists()
    job = TrainDraftConfig(input="x", output="y", target=str(teacher.dir), run_name="r", init_draft=str(head))
    with pytest.raises(ValueError, match=why):
        prepare_init_draft(job, tmp_path / "run", must_keep=[])


def test_cli_convert_of_a_published_head_for_the_teacher(teacher, tmp_path):
    """`specexit draft convert HEAD OUT --add-signals --target TEACHER`: aux layers written out, the
    teacher tokenizer's exit ids, the head's own keys and vocab maps kept, zero signal rows."""
    head = published_head(teacher, tmp_path / "head", aux_layers=NAMED_LAYERS)
    out = tmp_path / "se"
    assert cli_main(["draft", "convert", str(head), str(out), "--add-signals", "--target", str(teacher.dir)]) == 0
    j = json.loads((out / "config.json").read_text())
    assert j["architectures"] == [SPECEXIT_ARCH]
    assert (
        j["eagle_aux_hidden_state_layer_ids"] == NAMED_LAYERS == j["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    )
    published = PUBLISHED[FAMILY[teacher.name]][0]
    assert {k: j[k] for k in published if k != "architectures"} == {
        k: v for k, v in published.items() if k != "architectures"
    }
    se = read_config(out)  # no target needed any more
    ids = se.token_ids
    assert ids == {
        "think_start": teacher.tids.think_start,
        "think_end": THINK_END[teacher.name],
        "split": list(teacher.tids.split),
    }
    assert (
        se.signals == SIGNALS
        and se.aux_layer_ids == tuple(NAMED_LAYERS)
        and se.vocab_size == teacher.spec.full_vocab_size
    )
    # the head's own RoPE (Qwen3 heads: 1e6; Llama 3.1 heads name none: 10000), not the target's
    assert se.rope_theta == published.get("rope_theta", 10000.0)
    assert_vocab_maps(out, head, teacher)
    tensors = load_file(str(out / "model.safetensors"))
    assert_published_layout(tensors, se, signal_rows=len(SIGNALS))
    assert not tensors["fc.weight"][se.hidden_size :].any()  # confidence, progress, remaining rows: zero
    d = load_draft(out, target_embed=teacher.embed, expect_signals=True)
    assert torch.equal(d.fc.weight[: se.hidden_size], head_tensors(head)["fc.weight"].float())
    state = plugin_accepts(out)
    assert (state.think_start, state.think_end, state.split_ids) == (
        ids["think_start"],
        ids["think_end"],
        set(ids["split"]),
    )


def test_train_draft_init_draft_from_a_published_head_for_the_teacher(teacher, tmp_path):
    """`init_draft: HEAD` in train_draft.yaml: the job's own `prepare_init_draft`, then what its workers
    do with the result (`load_draft(..., expect_signals=True)` + the exit's token ids)."""
    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.job import exit_vocab, prepare_init_draft

    head = published_head(teacher, tmp_path / "head", aux_layers=NAMED_LAYERS)
    job = TrainDraftConfig(input="x", output="y", target=str(teacher.dir), run_name="r", init_draft=str(head))
    counts = torch.zeros(teacher.spec.full_vocab_size, dtype=torch.long)
    counts[teacher.tok.encode("\n\n", add_special_tokens=False)[0]] = 1  # the one break the traces use
    always, splits = exit_vocab(teacher.tids, counts.numpy())
    init, d2t, t2d = prepare_init_draft(job, tmp_path / "run", must_keep=[*always, *splits])
    se = read_config(init)
    assert Path(init) == tmp_path / "run" / "init_draft" and se.signals == SIGNALS
    assert se.aux_layer_ids == tuple(NAMED_LAYERS) and se.draft_vocab_size == N
    assert torch.equal(d2t, head_tensors(head)["d2t"].long()) and int(t2d.sum()) == N
    assert_vocab_maps(Path(init), head, teacher)
    draft = load_draft(init, target_embed=teacher.embed, expect_signals=True)
    draft.cfg = draft.cfg.replace(
        token_ids={k: v for k, v in teacher.tids.to_dict().items() if k in ("think_start", "think_end", "split")}
    )
    assert draft.cfg.token_ids["think_end"] == THINK_END[teacher.name]
    absent = int(torch.nonzero(~t2d)[0])  # an exit token the head's vocab lacks is refused before training
    with pytest.raises(SystemExit, match=rf"lacks token ids \[{absent}\]"):
        prepare_init_draft(job, tmp_path / "run2", must_keep=[absent])


# -- export: the draft train_draft builds for the teacher reads like a published head ------------------


def test_train_draft_export_has_the_published_names_plus_the_signal_rows(teacher, tmp_path):
    """train_draft's `build_draft` (what its workers train from scratch) and `save_draft` (what its
    checkpoints and export hold): the published tensor names and shapes, plus only SpecExit's 3 `fc`
    rows (confidence, progress, remaining) and the config's `specexit` block; stripped of them
    (`specexit draft convert` without `--add-signals`) it is a stock head, and that stock head imports
    back through the published-head path unchanged."""
    from transformers import AutoModelForCausalLM

    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.export import export_draft
    from pipelines.train_draft.job import exit_vocab
    from pipelines.train_draft.loop import build_draft
    from specexit_core.draft.vocab import draft_vocab_from_counts
    from specexit_core.teachers.materialize import load_vocab

    job = TrainDraftConfig(
        input="x",
        output="y",
        target=str(teacher.dir),
        run_name="r",
        aux_layer_ids=tuple(NAMED_LAYERS),
        draft_vocab_size=N,
        include_embed=False,
    )
    counts = torch.zeros(teacher.spec.full_vocab_size, dtype=torch.long)
    counts[list(load_vocab(teacher.spec.assets_dir).used_ids)] = 1  # the ids the teacher's traces use
    always, splits = exit_vocab(teacher.tids, counts.numpy())
    d2t, t2d = draft_vocab_from_counts(counts.numpy(), N, always, prefer=splits)
    target = AutoModelForCausalLM.from_pretrained(str(teacher.dir), dtype=torch.float32)
    ids = {
        "think_start": teacher.tids.think_start,
        "think_end": teacher.tids.think_end,
        "split": list(teacher.tids.split),
    }
    draft = build_draft(target, job, d2t, t2d, ids)
    ckpt = save_draft(draft, tmp_path / "ckpt", include_embed=job.include_embed, extra={"specexit_train": {"step": 0}})
    out = export_draft(ckpt, tmp_path / "out", {"train_config": job.model_dump(mode="json")})

    j = json.loads((out / "config.json").read_text())
    cfg = read_config(out)
    assert set(j) >= LOADER_KEYS and j["model_type"] == "llama" and j["num_hidden_layers"] == 1
    assert j["architectures"] == [SPECEXIT_ARCH] and j["vocab_size"] == teacher.spec.full_vocab_size
    assert j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == NAMED_LAYERS
    # the SpecExit extras: the `specexit` block (signals, their activations, which fc rows, token ids)
    assert j["specexit"]["signals"] == list(SIGNALS) == ["confidence", "progress", "remaining"]
    assert j["specexit"]["fc_signal_rows"] == [cfg.hidden_size, cfg.hidden_size + 3]
    assert j["specexit"]["token_ids"]["think_end"] == THINK_END[teacher.name]
    tensors = load_file(str(out / "model.safetensors"))
    assert_published_layout(tensors, cfg, signal_rows=len(SIGNALS))
    assert torch.equal(tensors["d2t"], d2t) and int(tensors["t2d"].sum()) == N

    stock = convert(out, tmp_path / "stock", add_signals=False)
    sj = json.loads((stock / "config.json").read_text())
    assert sj["architectures"] == [STOCK_ARCH] and "specexit" not in sj
    public = DraftConfig.from_hf_json(sj)
    assert public.signals == () and public == cfg.replace(signals=(), token_ids=None)
    st = load_file(str(stock / "model.safetensors"))
    assert_published_layout(st, public)
    assert torch.equal(st["fc.weight"], tensors["fc.weight"][: cfg.hidden_size])
    assert set(expected_shapes(public)) - {"embed_tokens.weight"} == set(PUBLISHED_SHAPES)
    # and back in through the published-head path: the same draft, signal rows zero
    back = tmp_path / "back"
    assert cli_main(["draft", "convert", str(stock), str(back), "--add-signals", "--token-ids", json.dumps(ids)]) == 0
    assert read_config(back) == cfg.replace(token_ids=read_config(back).token_ids)
    assert read_config(back).token_ids == ids
    bt = load_file(str(back / "model.safetensors"))
    assert all(torch.equal(bt[k], st[k]) for k in st if k != "fc.weight")


# -- the vLLM side ------------------------------------------------------------------------------------


def plugin_accepts(draft_dir):
    """The checks the vLLM plugin applies to a draft at load, on the config object vLLM builds from its
    config.json: the drafter class wants the signals, the runner hook the exit's token ids."""
    from transformers import AutoConfig

    from specexit_core.draft.config import read_specexit_fields
    from specexit_core.vllm_plugin.runner_hook import SpecExitRunnerState

    hf = AutoConfig.from_pretrained(str(draft_dir))
    assert read_specexit_fields(hf).signals == SIGNALS
    return SpecExitRunnerState(None, SimpleNamespace(config=hf))


def vllm_load_report(target: str, draft: str, pg_file: str) -> dict:
    """vLLM's own side of loading `draft` as the EAGLE-3 drafter of `target`, without an engine: the
    engine config (SpeculativeConfig reads the draft's config.json and resolves its architecture
    through the plugin's registration), the aux layers the V1 runner would take from it, the drafter
    class built in a one-process gloo group and its `load_weights` (vLLM's name mapping: `midlayer.*`,
    `d2t` -> `draft_id_to_target_id`, `t2d` skipped; an unknown name is an error), and the plugin's
    runner state from vLLM's config object. Run it in a subprocess (vLLM's process-wide state);
    tests/integration/test_vllm_plugin_teachers.py does, for qwen3-like."""
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    import specexit_core.vllm_plugin as plugin
    from specexit_core.vllm_env import apply_cpu_defaults
    from specexit_core.vllm_plugin.runner_hook import SpecExitRunnerState

    apply_cpu_defaults()
    plugin.register()
    spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": 2}
    args = EngineArgs(model=target, dtype="float32", enforce_eager=True, max_model_len=512, speculative_config=spec)
    vc = args.create_engine_config()
    dm = vc.speculative_config.draft_model_config
    cls, arch = ModelRegistry.resolve_model_cls(dm.architectures, model_config=dm)
    aux = GPUModelRunner._get_eagle3_aux_layers_from_config(SimpleNamespace(speculative_config=vc.speculative_config))
    w = load_file(str(Path(draft) / "model.safetensors"))
    with set_current_vllm_config(vc):
        init_distributed_environment(1, 0, f"file://{pg_file}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
        model = cls(vllm_config=vc, prefix="draft_model")
        model.load_weights(iter(w.items()))
    state = SpecExitRunnerState(None, model)
    return {
        "arch": arch,
        "cls": type(model).__name__,
        "aux": list(aux),
        "target_layers": vc.model_config.get_total_num_hidden_layers(),
        "fc": torch.equal(model.model.fc.weight, w["fc.weight"].float()),
        "signal_rows_zero": not model.signal_weight().any(),
        "lm_head": torch.equal(model.lm_head.weight, w["lm_head.weight"].float()),
        "d2t": torch.equal(model.draft_id_to_target_id, w["d2t"]),
        "has_own_embed_tokens": bool(getattr(model, "has_own_embed_tokens", False)),
        "token_ids": [state.think_start, state.think_end, sorted(state.split_ids)],
    }
