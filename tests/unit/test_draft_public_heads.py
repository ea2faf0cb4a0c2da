"""Published EAGLE-3 heads load and convert as shipped (docs/runbook.md, "Starting from a public
EAGLE-3 head"): tiny heads with the keys and tensor names of the published Llama-3.1-8B and Qwen3
ones, in `pytorch_model.bin` or `model.safetensors`, and a converted head passes the checks the vLLM
plugin applies when it loads a draft."""

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from specexit_app.cli import main as cli_main
from specexit_core.draft.checkpoint import CheckpointMismatch, convert, load_draft, read_config
from specexit_core.draft.config import LAYER_OPTIONS, DraftConfig, vllm_default_aux_layer_ids
from specexit_core.draft.for_target import convert_for_target
from specexit_core.draft.model import SpecExitDraft
from specexit_core.exit import SIGNALS
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR

V, N, H = 300, 64, 32  # target vocab, draft vocab, hidden (the published heads: 128256 / 151936, 32000, 4096)

# Keys as in SpecForge's configs/llama3-8B-eagle3.json, which is yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's
# config with the architecture renamed: no aux layer ids, no head_dim, no rope_theta.
LLAMA31_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": H,
    "initializer_range": 0.02,
    "intermediate_size": 112,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.28.1",
    "use_cache": True,
    "vocab_size": V,
    "draft_vocab_size": N,
}
# Keys as in the Qwen3 heads (SpecForge configs/qwen3-*-eagle3.json, AngelSlim/Qwen3-*_eagle3):
# Qwen3's own config keys on a Llama-layer drafter; aux layers only nested in eagle_config, as the
# SpecForge / AQ-MedAI heads that name them do.
QWEN3_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": H,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 1,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": V,
    "draft_vocab_size": N,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 33], "use_aux_hidden_state": True},
}
HEAD_TENSORS = [  # every tensor name a published Llama-layer EAGLE-3 head carries (embed_tokens optional)
    "fc.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
]


def head_tensors(cfg: DraftConfig, seed=0, dtype=torch.float16) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    d = SpecExitDraft(cfg)
    sd = {k: (torch.randn_like(v) * 0.1).to(dtype) for k, v in d.state_dict().items() if v.is_floating_point()}
    sd.pop("embed_tokens.weight")
    ids = torch.sort(torch.randperm(cfg.vocab_size)[: cfg.draft_vocab_size]).values
    sd["d2t"] = ids - torch.arange(cfg.draft_vocab_size)
    sd["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    sd["t2d"][ids] = True
    plain = cfg.layer == "llama" and not any(getattr(cfg, k) for k in LAYER_OPTIONS)
    assert set(HEAD_TENSORS) <= set(sd) and (not plain or sorted(sd) == sorted(HEAD_TENSORS))  # a variant may add norms
    return sd


def write_head(folder, config: dict, tensors: dict, fmt: str):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if fmt == "bin":
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    (folder / "README.md").write_text("a published head\n")
    return folder


def test_llama31_head_without_aux_layers_takes_vllms_default(tmp_path):
    with pytest.raises(ValueError, match="names no eagle_aux_hidden_state_layer_ids.*--target"):
        DraftConfig.from_hf_json(LLAMA31_HEAD)
    cfg = DraftConfig.from_hf_json(LLAMA31_HEAD, target_num_layers=32)  # Llama-3.1-8B: 32 layers
    assert cfg.aux_layer_ids == (2, 16, 29) == vllm_default_aux_layer_ids(32)
    assert cfg.head_dim == H // 4 and cfg.rope_theta == 10000.0 and cfg.signals == ()
    head = write_head(tmp_path / "head", LLAMA31_HEAD, head_tensors(cfg), "bin")
    embed = torch.randn(V, H)
    d = load_draft(head, target_embed=embed, target_num_layers=32)
    assert d.cfg == cfg and torch.equal(d.embed_tokens.weight, embed)
    want = head_tensors(cfg)
    assert torch.equal(d.fc.weight, want["fc.weight"].float()) and torch.equal(d.d2t, want["d2t"])


def test_qwen3_head_with_nested_aux_layers_and_an_unused_tensor(tmp_path, caplog):
    cfg = DraftConfig.from_hf_json(QWEN3_HEAD)
    assert cfg.aux_layer_ids == (1, 17, 33) and cfg.head_dim == 16 and cfg.rope_theta == 1e6
    tensors = head_tensors(cfg, dtype=torch.bfloat16)
    tensors["midlayer.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # old transformers saved it
    head = write_head(tmp_path / "head", QWEN3_HEAD, tensors, "safetensors")
    with caplog.at_level(logging.INFO, logger="specexit_core.draft.weights"):
        d = load_draft(head, target_embed=torch.zeros(V, H))
    assert "rotary_emb.inv_freq" in caplog.text
    assert torch.equal(d.lm_head.weight, tensors["lm_head.weight"].float())


def test_what_a_head_may_lack_is_filled_as_vllm_fills_it(tmp_path):
    cfg = DraftConfig.from_hf_json(QWEN3_HEAD)
    t = head_tensors(cfg)
    no_t2d = {k: v for k, v in t.items() if k != "t2d"}  # vLLM skips t2d: it is d2t's image
    d = load_draft(write_head(tmp_path / "a", QWEN3_HEAD, no_t2d, "bin"), target_embed=torch.zeros(V, H))
    assert torch.equal(d.t2d, t["t2d"])
    full_vocab = {**QWEN3_HEAD, "draft_vocab_size": V}
    fcfg = DraftConfig.from_hf_json(full_vocab)
    f = {k: v for k, v in head_tensors(fcfg).items() if k not in ("d2t", "t2d")}
    d = load_draft(write_head(tmp_path / "b", full_vocab, f, "bin"), target_embed=torch.zeros(V, H))
    assert not d.d2t.any() and d.t2d.all()
    with pytest.raises(ValueError, match="no d2t"):
        load_draft(write_head(tmp_path / "c", QWEN3_HEAD, {k: v for k, v in t.items() if k != "d2t"}, "bin"))


def test_speculators_layer_names_and_shape_clashes(tmp_path):
    cfg = DraftConfig.from_hf_json(QWEN3_HEAD)
    t = {k.replace("midlayer.", "layers.0."): v for k, v in head_tensors(cfg).items()}
    d = load_draft(write_head(tmp_path / "a", QWEN3_HEAD, t, "safetensors"), target_embed=torch.zeros(V, H))
    assert d.midlayer.self_attn.q_proj.weight.shape == (4 * 16, 2 * H)
    bad = {**head_tensors(cfg), "lm_head.weight": torch.zeros(N + 1, H)}
    with pytest.raises(CheckpointMismatch, match=r"lm_head.weight has shape \[65, 32\]"):
        load_draft(write_head(tmp_path / "b", QWEN3_HEAD, bad, "bin"), target_embed=torch.zeros(V, H))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps(QWEN3_HEAD))
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin"):
        load_draft(tmp_path / "c")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"architectures": ["Eagle3DeepseekV2ForCausalLM"]}, "architectures .*Llama layer .*Qwen3 layer"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_hidden_layers": 2}, "num_hidden_layers"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "plain RoPE"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"eagle_config": {"use_aux_hidden_state": False}}, "EAGLE-1"),
        ({"hidden_size": None}, "hidden_size = None"),
    ],
)
def test_heads_whose_layer_we_do_not_compute_are_refused_by_name(change, match):
    with pytest.raises(ValueError, match=match):
        DraftConfig.from_hf_json({**QWEN3_HEAD, **change}, target_num_layers=36)


@pytest.mark.parametrize(
    "change, want",
    [
        ({"architectures": ["Eagle3Qwen3ForCausalLM"]}, {"layer": "qwen3"}),
        ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, {"layer": "qwen3"}),
        ({"norm_before_residual": True}, {"norm_before_residual": True}),
        (
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "norm_before_fc": True}},
            {"norm_before_fc": True},
        ),
        (
            {"norm_before_fc": True, "eagle_config": {"norm_before_fc": False}},
            {"norm_before_fc": False},
        ),  # nested first
        ({"fc_norm": True, "norm_output": True}, {"fc_norm": True, "norm_output": True}),
    ],
)
def test_the_layer_variants_vllm_runs_are_read_as_vllm_reads_them(change, want):
    cfg = DraftConfig.from_hf_json({**QWEN3_HEAD, **change}, target_num_layers=36)
    assert {k: getattr(cfg, k) for k in want} == want
    again = DraftConfig.from_hf_json(cfg.to_hf_json())  # our export says them explicitly
    assert again == cfg


def test_all_stock_llama_layer_names_are_accepted():
    for arch in ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLM"):
        assert DraftConfig.from_hf_json({**QWEN3_HEAD, "architectures": [arch]}).signals == ()


def test_vllm_default_layers():
    assert vllm_default_aux_layer_ids(36) == (2, 18, 33)  # Qwen3-4B / 8B
    for tiny in (4, 6):  # (2, 2, 1), (2, 3, 3): vLLM would repeat a layer
        with pytest.raises(ValueError, match="invalid for a"):
            vllm_default_aux_layer_ids(tiny)
    assert vllm_default_aux_layer_ids(7) == (2, 3, 4)


def test_convert_of_a_published_head_names_its_layers_and_is_complete(tmp_path):
    cfg = DraftConfig.from_hf_json(LLAMA31_HEAD, target_num_layers=32)
    head = write_head(tmp_path / "head", LLAMA31_HEAD, head_tensors(cfg), "bin")
    ids = {"think_start": 7, "think_end": 8, "split": [5, 9]}
    out = convert(head, tmp_path / "se", add_signals=True, token_ids=ids, target_num_layers=32)
    j = json.loads((out / "config.json").read_text())
    assert j["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29] == j["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert j["specexit"]["token_ids"] == ids and j["bos_token_id"] == 128000  # the head's own keys stay
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    se = read_config(out)  # no target needed any more
    assert se.signals == SIGNALS and se.aux_layer_ids == (2, 16, 29)
    d = load_draft(out, target_embed=torch.zeros(V, H))
    assert d.fc.weight.shape == (H + 3, 3 * H) and not d.fc.weight[H:].any()


def _plugin_accepts(draft_dir):
    """The checks the vLLM plugin applies to a draft at load, on the config object vLLM builds from its
    config.json: the drafter class wants the signals, the runner hook the exit's token ids."""
    from transformers import AutoConfig

    from specexit_core.draft.config import read_specexit_fields
    from specexit_core.vllm_plugin.runner_hook import SpecExitRunnerState

    hf = AutoConfig.from_pretrained(str(draft_dir))
    assert read_specexit_fields(hf).signals == SIGNALS
    return SpecExitRunnerState(None, SimpleNamespace(config=hf))


def public_shaped_toy_head(tmp_path):
    """The shipped toy draft written the way published heads ship: stock architecture, no signal rows,
    no `specexit` block, aux layers only in eagle_config, `pytorch_model.bin`, no embed_tokens."""
    from safetensors.torch import load_file

    stock = convert(DRAFT_DIR, tmp_path / "stock", add_signals=False)
    j = json.loads((stock / "config.json").read_text())
    j.pop("eagle_aux_hidden_state_layer_ids")
    j["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}
    t = load_file(str(stock / "model.safetensors"))
    t.pop("embed_tokens.weight", None)
    return write_head(tmp_path / "head", j, t, "bin")


def test_cli_convert_of_a_published_head_is_deployable(tmp_path, capsys):
    head = public_shaped_toy_head(tmp_path)
    # without token ids the result could not be served: refused, saying what to give
    assert cli_main(["draft", "convert", str(head), str(tmp_path / "x"), "--add-signals"]) == 2
    assert "--target" in capsys.readouterr().err and not (tmp_path / "x").exists()
    out = tmp_path / "se"
    assert cli_main(["draft", "convert", str(head), str(out), "--add-signals", "--target", str(TEACHER_DIR)]) == 0
    shipped = read_config(DRAFT_DIR)
    assert read_config(out).token_ids == shipped.token_ids  # the toy tokenizer's <think>, </think>, "\n\n"
    state = _plugin_accepts(out)
    assert (state.think_start, state.think_end, sorted(state.split_ids)) == (
        shipped.token_ids["think_start"],
        shipped.token_ids["think_end"],
        shipped.token_ids["split"],
    )
    ids = '{"think_start": 1, "think_end": 2, "split": [3]}'
    assert cli_main(["draft", "convert", str(head), str(tmp_path / "se2"), "--add-signals", "--token-ids", ids]) == 0
    assert _plugin_accepts(tmp_path / "se2").split_ids == {3}


def test_plugin_refuses_a_converted_draft_without_token_ids(tmp_path):
    out = convert(public_shaped_toy_head(tmp_path), tmp_path / "se", add_signals=True)  # the Python API allows it
    with pytest.raises(ValueError, match="lacks specexit.token_ids"):
        _plugin_accepts(out)
    assert convert_for_target(out, tmp_path / "stock2", add_signals=False).exists()


def test_train_draft_init_from_a_published_head_without_aux_layers(tmp_path):
    """`init_draft:` a downloaded head that names no aux layers: the job takes vLLM's default layers of
    its target (here an 8-layer one: 2, 4, 5) and starts from the head with zero signal rows."""
    from transformers import LlamaConfig

    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.job import prepare_init_draft

    target = tmp_path / "target"
    LlamaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=8, num_attention_heads=4).save_pretrained(target)
    cfg = DraftConfig.from_hf_json(LLAMA31_HEAD, target_num_layers=8)
    head = write_head(tmp_path / "head", LLAMA31_HEAD, head_tensors(cfg), "bin")
    job = TrainDraftConfig(input="x", output="y", target=str(target), run_name="r", init_draft=str(head))
    init, d2t, t2d = prepare_init_draft(job, tmp_path / "run", must_keep=[])
    se = read_config(init)
    assert se.aux_layer_ids == (2, 4, 5) and se.signals == SIGNALS
    assert torch.equal(d2t, head_tensors(cfg)["d2t"]) and int(t2d.sum()) == N


def test_our_stock_export_has_the_published_keys_and_tensor_names(tmp_path):
    """Issue 13 item 5 the other way round: what we write reads like a published head."""
    from safetensors.torch import load_file

    from specexit_core.draft.checkpoint import save_draft

    cfg = DraftConfig.from_hf_json(QWEN3_HEAD)
    d = SpecExitDraft(cfg.replace(signals=()))
    out = save_draft(d, tmp_path / "ours", include_embed=False)
    j = json.loads((out / "config.json").read_text())
    shared = set(LLAMA31_HEAD) - {"bos_token_id", "eos_token_id", "pad_token_id", "initializer_range"}
    shared -= {"transformers_version", "use_cache"}
    assert shared <= set(j) and j["architectures"] == ["LlamaForCausalLMEagle3"] and j["model_type"] == "llama"
    assert sorted(load_file(str(out / "model.safetensors"))) == sorted(HEAD_TENSORS)
    assert DraftConfig.from_hf_json(j) == cfg.replace(signals=())
