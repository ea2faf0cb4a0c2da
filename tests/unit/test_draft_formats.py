"""Both layouts published EAGLE-3 heads ship in (specexit_core/draft/formats.py, docs/draft_formats.md):
the speculators one (RedHatAI's `*-speculator.eagle3`, vllm-project/speculators) read exactly as vLLM
0.32 reads it, every layer option surviving `--add-signals` and `--format speculators`, the way back
to a head stock vLLM serves, and one clear line for a bad head."""

import copy
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from specexit_app.cli import main as cli_main
from specexit_core.draft import formats
from specexit_core.draft.checkpoint import load_draft, read_config
from specexit_core.draft.config import LAYER_OPTIONS, SPECEXIT_ARCH, SPECEXIT_QWEN3_ARCH, DraftConfig
from specexit_core.exit import SIGNALS
from tests.unit.test_draft_public_heads import H, N, V, head_tensors, write_head

# As published (nm-testing/EAGLE3-LLaMA3.1-Instruct-8B-converted, config.json: the EAGLE authors' head in
# the speculators layout), at toy sizes: hidden 4096 -> 32, vocab 128256 -> 300, draft vocab 32000 -> 64.
SPECULATORS_HEAD = {
    "architectures": ["Eagle3Speculator"],
    "auto_map": {"": "eagle3.Eagle3SpeculatorConfig"},
    "draft_vocab_size": N,
    "has_no_defaults_at_init": False,
    "norm_before_residual": False,
    "speculators_config": {
        "algorithm": "eagle3",
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": 5, "verifier_accept_k": 1}
        ],
        "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "meta-llama/Llama-3.1-8B-Instruct"},
    },
    "speculators_model_type": "eagle3",
    "speculators_version": "0.1.0.dev14",
    "target_hidden_size": None,
    "torch_dtype": "float32",
    "transformer_layer_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": 8,
        "hidden_act": "silu",
        "hidden_size": H,
        "initializer_range": 0.02,
        "intermediate_size": 112,
        "max_position_embeddings": 2048,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "use_cache": True,
        "vocab_size": V,
    },
    "transformers_version": "4.53.2",
}
AUX = [1, 5, 9]
TOKEN_IDS = '{"think_start": 1, "think_end": 2, "split": [3]}'


def add_signals(src, dst, *extra: str) -> int:
    """`specexit draft convert SRC DST --add-signals --token-ids TOKEN_IDS [EXTRA]`: its exit status."""
    return cli_main(["draft", "convert", str(src), str(dst), "--add-signals", "--token-ids", TOKEN_IDS, *extra])


def speculators_head(**change) -> dict:
    d = copy.deepcopy(SPECULATORS_HEAD)
    layer = change.pop("layer", None)
    if layer:
        d["transformer_layer_config"].update(layer)
    d.update(change)
    for k in [k for k, v in d.items() if v == "DROP"]:
        del d[k]
    return d


def speculators_tensors(cfg: DraftConfig) -> dict:
    return formats.speculators_tensor_names(head_tensors(cfg))


def vllm_reading(d: dict) -> dict:
    """What vLLM 0.32 makes of a speculators config (its own reader, the reference)."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    return SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(d))


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"norm_before_residual": True},
        {"norm_before_residual": "DROP"},  # absent: vLLM's speculators default, True
        {"eagle_aux_hidden_state_layer_ids": AUX, "norm_before_fc": True, "fc_norm": True, "norm_output": True},
        {"layer": {"model_type": "qwen3"}, "target_hidden_size": 48},
    ],
    ids=["published", "nbr-true", "nbr-absent", "aux-and-norms", "qwen3-layer"],
)
def test_speculators_configs_are_read_as_vllm_reads_them(change):
    pytest.importorskip("vllm")
    d = speculators_head(**change)
    ours, theirs = formats.flat_config(d), vllm_reading(d)
    assert {k: ours.get(k) for k in theirs} == theirs  # every key vLLM's drafter gets, with its value
    cfg = DraftConfig.from_hf_json(d, target_num_layers=12)
    assert cfg.layer == d["transformer_layer_config"]["model_type"]
    assert cfg.norm_before_residual is theirs["norm_before_residual"]
    assert cfg.aux_layer_ids == tuple(d.get("eagle_aux_hidden_state_layer_ids") or (2, 6, 9))  # vLLM's default


@pytest.mark.parametrize("nbr", [False, True])
@pytest.mark.parametrize("aux", ["top", "nested", "absent"])
def test_a_converted_head_keeps_its_settings_in_both_layouts(tmp_path, nbr, aux):
    """norm_before_residual true and false, aux ids at the top level, nested or absent: all survive
    --add-signals (flat), --format speculators, and the way back (--strip-signals)."""
    flat_head = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **{k: v for k, v in SPECULATORS_HEAD["transformer_layer_config"].items()},
        "draft_vocab_size": N,
        "norm_before_residual": nbr,
        **({"eagle_aux_hidden_state_layer_ids": AUX} if aux == "top" else {}),
        **({"eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX}} if aux == "nested" else {}),
    }
    target = _tiny_target(tmp_path)
    want_aux = (2, 6, 9) if aux == "absent" else tuple(AUX)
    head = write_head(
        tmp_path / "head",
        flat_head,
        head_tensors(DraftConfig.from_hf_json(flat_head, target_num_layers=12)),
        "safetensors",
    )
    ids = TOKEN_IDS
    base = ["draft", "convert", "--target", str(target), "--token-ids", ids]
    assert cli_main([*base[:2], str(head), str(tmp_path / "a"), "--add-signals", *base[2:]]) == 0
    assert (
        cli_main(
            [*base[:2], str(tmp_path / "a"), str(tmp_path / "s"), "--add-signals", *base[2:], "--format", "speculators"]
        )
        == 2
    )  # already has them
    assert (
        cli_main([*base[:2], str(head), str(tmp_path / "s"), "--add-signals", *base[2:], "--format", "speculators"])
        == 0
    )
    assert (
        cli_main(
            [
                *base[:2],
                str(tmp_path / "s"),
                str(tmp_path / "back"),
                "--strip-signals",
                *base[2:],
                "--format",
                "speculators",
            ]
        )
        == 0
    )
    for name, signals in (("a", SIGNALS), ("s", SIGNALS), ("back", ())):
        cfg = read_config(tmp_path / name)
        assert (cfg.norm_before_residual, cfg.aux_layer_ids, cfg.signals) == (nbr, want_aux, signals), name
    spec = json.loads((tmp_path / "s" / "config.json").read_text())
    assert spec["speculators_model_type"] == "eagle3" and spec["norm_before_residual"] is nbr
    assert spec["speculators_config"]["verifier"]["name_or_path"] == str(target.resolve())
    assert spec["transformer_layer_config"]["specexit"]["signals"] == list(SIGNALS)
    assert "specexit" not in json.loads((tmp_path / "back" / "config.json").read_text())["transformer_layer_config"]
    names = set(load_file(str(tmp_path / "s" / "model.safetensors")))
    assert "layers.0.self_attn.q_proj.weight" in names and not any(n.startswith("midlayer.") for n in names)
    # the converted drafts compute what the head computes (signal rows aside)
    emb = torch.randn(V, H)
    a, s = load_draft(tmp_path / "a", target_embed=emb), load_draft(tmp_path / "s", target_embed=emb)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in s.state_dict().items())


def test_a_speculators_qwen3_head_becomes_a_qwen3_layer_specexit_draft(tmp_path):
    d = speculators_head(layer={"model_type": "qwen3"}, eagle_aux_hidden_state_layer_ids=AUX, norm_before_residual=True)
    cfg = DraftConfig.from_hf_json(d)
    head = write_head(tmp_path / "head", d, speculators_tensors(cfg), "safetensors")
    out = tmp_path / "out"
    assert add_signals(head, out) == 0
    j = json.loads((out / "config.json").read_text())
    assert j["architectures"] == [SPECEXIT_QWEN3_ARCH] and j["model_type"] == "qwen3"
    assert {k: j[k] for k in LAYER_OPTIONS} == {**dict.fromkeys(LAYER_OPTIONS, False), "norm_before_residual": True}
    draft = load_draft(out, target_embed=torch.zeros(V, H))
    assert draft.midlayer.self_attn.q_norm.weight.shape == (8,)


def test_the_plugin_keeps_a_specexit_draft_in_the_speculators_layout_on_its_drafter():
    pytest.importorskip("vllm")
    from specexit_core.vllm_plugin.speculators_format import install_speculators_format

    install_speculators_format()
    install_speculators_format()  # idempotent
    spec = formats.speculators_json(
        DraftConfig.from_hf_json(speculators_head(), target_num_layers=12)
        .replace(signals=SIGNALS, token_ids={"think_start": 1, "think_end": 2, "split": [3]})
        .to_hf_json(),
        verifier="/t",
    )
    assert vllm_reading(spec)["architectures"] == [SPECEXIT_ARCH]
    q = copy.deepcopy(spec)
    q["transformer_layer_config"]["model_type"] = "qwen3"
    assert vllm_reading(q)["architectures"] == [SPECEXIT_QWEN3_ARCH]
    assert vllm_reading(speculators_head())["architectures"] == [
        "Eagle3LlamaForCausalLM"
    ]  # a stock head: as vLLM reads it


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"transformer_layer_config": "DROP"}, "no transformer_layer_config"),
        ({"speculators_model_type": "dflash"}, "speculators_model_type 'dflash'"),
        ({"layer": {"model_type": "mistral"}}, "model_type 'mistral'"),
        ({"layer": {"hidden_size": None}}, "hidden_size = None"),
    ],
)
def test_a_bad_speculators_config_gets_one_line_naming_the_field(tmp_path, capsys, bad, match):
    d = speculators_head(**bad)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.json").write_text(json.dumps(d))
    assert add_signals(tmp_path / "h", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err


@pytest.mark.parametrize(
    "tamper, match",
    [
        (
            lambda t: t.update({"fc.weight": torch.zeros(H, 2 * H)}),
            r"fc.weight has shape \[32, 64\]",
        ),  # wrong hidden size
        (lambda t: t.pop("fc.weight"), "missing tensor 'fc.weight'"),
        (lambda t: (t.pop("d2t"), t.pop("t2d")), "no d2t"),
    ],
)
def test_a_bad_head_gets_one_line_naming_the_tensor(tmp_path, capsys, tamper, match):
    cfg = DraftConfig.from_hf_json(speculators_head(), target_num_layers=12)
    t = speculators_tensors(cfg)
    tamper(t)
    head = write_head(tmp_path / "h", speculators_head(eagle_aux_hidden_state_layer_ids=AUX), t, "safetensors")
    assert add_signals(head, tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err


def test_speculators_output_needs_a_verifier(tmp_path, capsys):
    flat = {
        **SPECULATORS_HEAD["transformer_layer_config"],
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": N,
        "eagle_aux_hidden_state_layer_ids": AUX,
    }
    head = write_head(tmp_path / "h", flat, head_tensors(DraftConfig.from_hf_json(flat)), "safetensors")
    argv = [
        "draft",
        "convert",
        str(head),
        str(tmp_path / "o"),
        "--add-signals",
        "--token-ids",
        TOKEN_IDS,
    ]
    assert cli_main([*argv, "--format", "speculators"]) == 2
    assert "--target" in capsys.readouterr().err
    assert cli_main([*argv, "--format", "nope"]) == 2
    assert "'nope'" in capsys.readouterr().err


def _tiny_target(tmp_path):
    """A target folder with just what the converter reads from it: its layer count and architectures."""
    t = tmp_path / "target"
    t.mkdir()
    (t / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": 12,
                "hidden_size": H,
                "num_attention_heads": 4,
                "vocab_size": V,
            }
        )
    )
    return t


def test_train_draft_starts_from_a_speculators_qwen3_head_and_keeps_its_layer(tmp_path):
    """`init_draft:` a speculators-layout head with a Qwen3 layer and norm_before_residual (RedHatAI's
    style): the job's starting folder is a SpecExit draft with the same layer and options."""
    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.job import prepare_init_draft

    target = _tiny_target(tmp_path)
    d = speculators_head(layer={"model_type": "qwen3"}, eagle_aux_hidden_state_layer_ids=AUX, norm_before_residual=True)
    cfg = DraftConfig.from_hf_json(d)
    head = write_head(tmp_path / "head", d, speculators_tensors(cfg), "safetensors")
    job = TrainDraftConfig(input="x", output="y", target=str(target), run_name="r", init_draft=str(head))
    init, d2t, _ = prepare_init_draft(job, tmp_path / "run", must_keep=[])
    se = read_config(init)
    assert (se.layer, se.norm_before_residual, se.signals, se.aux_layer_ids) == ("qwen3", True, SIGNALS, tuple(AUX))
    assert load_draft(init, target_embed=torch.zeros(V, H)).midlayer.self_attn.k_norm is not None


def test_a_new_draft_takes_the_recipes_layer():
    """`layer: qwen3` in the train_draft config (examples/qwen3_like/train_draft_qwen3_layer.yaml): the
    new draft has Qwen3's layer; an unknown layer is a config error naming the choices."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pipelines.stages import load_stage_config
    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.loop import build_draft

    recipe = load_stage_config("train_draft", "examples/qwen3_like/train_draft_qwen3_layer.yaml")
    assert recipe.layer == "qwen3"
    target = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=V,
            hidden_size=H,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=64,
        )
    )
    job = TrainDraftConfig(
        input="x", output="y", target="t", run_name="r", draft_vocab_size=N, aux_layer_ids=(1, 2, 3), layer="qwen3"
    )
    draft = build_draft(target, job, torch.zeros(N, dtype=torch.long), torch.ones(V, dtype=torch.bool))
    assert draft.cfg.layer == "qwen3" and draft.cfg.to_hf_json()["architectures"] == [SPECEXIT_QWEN3_ARCH]
    with pytest.raises(ValueError, match="layer must be one of"):
        TrainDraftConfig(input="x", output="y", target="t", run_name="r", draft_vocab_size=N, layer="mistral")


def test_exit_defaults_written_into_a_speculators_draft_keep_its_layout(tmp_path):
    """Calibration writes the chosen exit into the served draft (`set_exit_defaults`): a speculators-layout
    draft stays in that layout, its `specexit` block where vLLM hands it to the drafter."""
    from specexit_core.draft.checkpoint import set_exit_defaults

    d = speculators_head(eagle_aux_hidden_state_layer_ids=AUX)
    head = write_head(tmp_path / "head", d, speculators_tensors(DraftConfig.from_hf_json(d)), "safetensors")
    out = tmp_path / "out"
    assert add_signals(head, out, "--format", "speculators") == 0
    set_exit_defaults(out, {"confidence_threshold": 0.7})
    j = json.loads((out / "config.json").read_text())
    assert (
        formats.format_of(j) == formats.SPECULATORS
        and j["speculators_config"] == json.loads((tmp_path / "head" / "config.json").read_text())["speculators_config"]
    )
    assert j["transformer_layer_config"]["specexit"]["exit_defaults"] == {"confidence_threshold": 0.7}
    assert read_config(out).exit_defaults == {"confidence_threshold": 0.7}
