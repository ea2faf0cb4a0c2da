"""Draft model, checkpoint I/O and the TTT loss (small random models: the math, not the quality)."""

import json

import pytest
import torch

from specexit_core.draft.checkpoint import CheckpointMismatch, convert, load_draft, save_draft
from specexit_core.draft.config import DraftConfig, SPECEXIT_ARCH, STOCK_ARCH
from specexit_core.draft.model import DraftKV, SpecExitDraft
from specexit_core.draft.vocab import build_draft_vocab
from specexit_core.training.loss import DynamicWeighting, LossConfig, ttt_token_loss, ttt_unroll


def small_cfg(**kw) -> DraftConfig:
    base = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
                vocab_size=50, draft_vocab_size=30, aux_layer_ids=(1, 2, 3), target_hidden_size=32)
    base.update(kw)
    return DraftConfig(**base)


def random_draft(seed=0, **kw) -> SpecExitDraft:
    torch.manual_seed(seed)
    d = SpecExitDraft(small_cfg(**kw))
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.2)
    d2t, t2d = build_draft_vocab([list(range(0, 50, 2)) * 3 + [7, 9, 11]], 50, d.cfg.draft_vocab_size)
    d.d2t.copy_(d2t)
    d.t2d.copy_(t2d)
    return d.eval()


def test_config_json_has_the_fields_vllm_reads():
    cfg = small_cfg()
    j = cfg.to_hf_json()
    assert j["architectures"] == [SPECEXIT_ARCH] and SPECEXIT_ARCH.endswith("Eagle3")
    assert j["draft_vocab_size"] == 30 and j["num_hidden_layers"] == 1
    assert j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert j["specexit"]["signals"] == ["confidence", "progress", "remaining"]
    assert DraftConfig.from_hf_json(j) == cfg
    assert small_cfg(signals=()).to_hf_json()["architectures"] == [STOCK_ARCH]


def test_config_validation():
    with pytest.raises(ValueError, match="3 target layers"):
        small_cfg(aux_layer_ids=(1, 2))
    with pytest.raises(ValueError, match="distinct"):
        small_cfg(aux_layer_ids=(1, 1, 2))


def test_draft_vocab_maps():
    d2t, t2d = build_draft_vocab([[5, 5, 5, 7, 7, 9]], vocab_size=12, draft_vocab_size=4, always=[11])
    targets = (torch.arange(4) + d2t).tolist()
    assert targets == sorted(targets) and {5, 7, 9, 11} == set(targets)
    assert t2d.sum() == 4 and all(t2d[t] for t in targets)


def test_fc_has_signal_rows():
    d = random_draft()
    assert tuple(d.fc.weight.shape) == (32 + 3, 3 * 32)
    h, raw = d.fuse(torch.randn(2, 5, 96))
    assert h.shape == (2, 5, 32) and raw.shape == (2, 5, 3)


def test_save_load_round_trip(tmp_path):
    d = random_draft()
    save_draft(d, tmp_path / "ck")
    d2 = load_draft(tmp_path / "ck")
    for k, v in d.state_dict().items():
        assert torch.equal(v, d2.state_dict()[k]), k
    # embed can be left out (vLLM shares the target's) and supplied at load time
    save_draft(d, tmp_path / "noemb", include_embed=False)
    with pytest.raises(CheckpointMismatch, match="embed"):
        load_draft(tmp_path / "noemb")
    d3 = load_draft(tmp_path / "noemb", target_embed=d.embed_tokens.weight.detach())
    assert torch.equal(d3.fc.weight, d.fc.weight)


def test_stock_and_specexit_checkpoints_convert_and_never_misload(tmp_path):
    d = random_draft()
    save_draft(d, tmp_path / "se")
    convert(tmp_path / "se", tmp_path / "stock", add_signals=False)
    cfg = json.loads((tmp_path / "stock" / "config.json").read_text())
    assert cfg["architectures"] == [STOCK_ARCH] and "specexit" not in cfg
    stock = load_draft(tmp_path / "stock")
    assert tuple(stock.fc.weight.shape) == (32, 96)
    # loading it as a SpecExit draft fails loudly, naming both shapes
    with pytest.raises(CheckpointMismatch, match=r"fc.weight has shape \[32, 96\], expected \[35, 96\].*stock EAGLE-3"):
        load_draft(tmp_path / "stock", expect_signals=True)
    with pytest.raises(CheckpointMismatch, match=r"\[35, 96\], expected \[32, 96\].*SpecExit checkpoint"):
        load_draft(tmp_path / "se", expect_signals=False)
    back = load_draft(convert(tmp_path / "stock", tmp_path / "back", add_signals=True))
    assert torch.equal(back.fc.weight[:32], d.fc.weight[:32]) and back.fc.weight[32:].abs().sum() == 0
    with pytest.raises(CheckpointMismatch, match="already has signal rows"):
        convert(tmp_path / "back", tmp_path / "again", add_signals=True)


def test_checkpoint_with_wrong_tensor_shape_is_rejected(tmp_path):
    from safetensors.torch import load_file, save_file

    save_draft(random_draft(), tmp_path / "ck")
    t = load_file(str(tmp_path / "ck" / "model.safetensors"))
    t["lm_head.weight"] = torch.zeros(31, 32)
    save_file(t, str(tmp_path / "ck" / "model.safetensors"))
    with pytest.raises(CheckpointMismatch, match=r"lm_head.weight has shape \[31, 32\], expected \[30, 32\]"):
        load_draft(tmp_path / "ck")


@torch.no_grad()
def test_ttt_unroll_equals_inference_chain():
    """Training-time test sees exactly what inference sees: step j at index t == running the draft
    with a KV cache over indices <= t (real features) and then j chained steps (teacher-forced)."""
    d = random_draft(seed=1)
    T = 12
    ids = torch.randint(0, 50, (1, T))
    aux = torch.randn(1, T, 96)
    steps = {j: lg for j, lg, _ in ttt_unroll(d, aux, ids, unroll=4)}
    for t in [0, 3, 6]:
        cache = DraftKV()
        hid, _ = d.fuse(aux[:, : t + 1])
        lg, pre, cache = d.forward_cached(ids[:, 1 : t + 2], hid, torch.arange(t + 1)[None], cache)
        assert torch.allclose(lg[0, -1], steps[0][0, t], atol=1e-4)
        last = pre[:, -1:]
        for j in range(1, 4):
            if t + j + 1 >= T:
                break
            lg, last, cache = d.forward_cached(ids[:, t + j + 1 : t + j + 2], last, torch.tensor([[t + j]]), cache)
            assert torch.allclose(lg[0, -1], steps[j][0, t], atol=1e-4), (t, j)


def test_ttt_loss_decreases_when_overfitting_one_batch():
    d = random_draft(seed=2)
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 10))
    aux = torch.randn(2, 10, 96)
    tgt = torch.randn(2, 10, 50) * 20  # near one-hot targets: the CE floor is ~0
    mask = torch.ones(2, 10)
    opt = torch.optim.Adam([p for p in d.parameters() if p.requires_grad], lr=3e-3)
    cfg = LossConfig(unroll=3)
    first = None
    for _ in range(60):
        loss, m = ttt_token_loss(d, aux, ids, tgt, mask, cfg)
        first = first if first is not None else loss.item()
        opt.zero_grad(); loss.backward(); opt.step()
    assert loss.item() < 0.5 * first
    assert set(m) >= {"acc_0", "acc_1", "acc_2", "loss_0"}


@pytest.mark.parametrize("mode", ["uncertainty", "ratio", "fixed"])
def test_dynamic_weighting_modes(mode):
    w = DynamicWeighting(LossConfig(weighting=mode))
    tok = torch.tensor(2.0, requires_grad=True)
    sig = {k: torch.tensor(v, requires_grad=True) for k, v in [("confidence", 0.5), ("progress", 0.1), ("remaining", 8.0)]}
    total, logs = w(tok, sig)
    assert set(logs) == {"w_confidence", "w_progress", "w_remaining"}
    total.backward()
    assert all(s.grad is not None for s in sig.values())
    if mode == "ratio":  # every term brought to the token loss' scale
        assert logs["w_remaining"] == pytest.approx(2.0 / 8.0)


def test_loss_config_validation():
    with pytest.raises(ValueError):
        LossConfig(weighting="magic")
    with pytest.raises(ValueError):
        LossConfig(unroll=0)


def test_target_features_restricted_to_draft_vocab_equal_full_logits_sliced(teacher):
    """Training applies only the draft vocab's rows of the LM head (memory on real vocabularies)."""
    import torch

    from specexit_core.training.features import target_features

    model, tok = teacher
    ids = torch.tensor([tok.encode("1 + 2 = 3\n\n3 * 4 = 12")])
    mask = torch.ones_like(ids)
    rows = torch.tensor([5, 17, 3, 40])
    aux_full, full = target_features(model, ids, mask, (1, 2, 3))
    aux_cut, cut = target_features(model, ids, mask, (1, 2, 3), vocab_rows=rows)
    torch.testing.assert_close(aux_cut, aux_full)
    torch.testing.assert_close(cut, full[..., rows], rtol=1e-5, atol=1e-5)
