"""Draft model, checkpoint I/O and the TTT loss (small random models: the math, not the quality)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from specexit_core.draft.checkpoint import CheckpointMismatch, convert, load_draft, save_draft
from specexit_core.draft.config import SPECEXIT_ARCH, STOCK_ARCH, DraftConfig
from specexit_core.draft.model import DraftKV, SpecExitDraft
from specexit_core.draft.vocab import build_draft_vocab
from specexit_core.training import ttt_attention
from specexit_core.training.loss import (
    END_FROM,
    DynamicWeighting,
    LossConfig,
    signal_losses,
    ttt_token_loss,
    ttt_unroll,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_cfg(**kw) -> DraftConfig:
    base = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        vocab_size=50,
        draft_vocab_size=30,
        aux_layer_ids=(1, 2, 3),
        target_hidden_size=32,
    )
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


VARIANTS = [  # the decoder layers and layer options vLLM's eagle3 drafters honour (DraftConfig)
    {},
    {"layer": "qwen3"},
    {"norm_before_residual": True},
    {"norm_before_fc": True},
    {"fc_norm": True},
    {"norm_output": True},
    {"layer": "qwen3", "norm_before_residual": True, "fc_norm": True, "norm_output": True},
]


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) or "plain")
def test_ttt_unroll_equals_inference_chain(variant):
    """Training-time test sees exactly what inference sees: step j at index t == running the draft
    with a KV cache over indices <= t (real features) and then j chained steps (teacher-forced),
    for every layer variant (the hidden carried between steps, `carry`, included)."""
    d = random_draft(seed=1, **variant)
    T = 12
    ids = torch.randint(0, 50, (1, T))
    aux = torch.randn(1, T, 96)
    steps = {j: d.head(pre) for j, pre, _ in ttt_unroll(d, aux, ids, unroll=4)}
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


def dense_ttt_logits(d: SpecExitDraft, aux, ids, unroll: int) -> list[torch.Tensor]:
    """The TTT unroll written out with dense [n, n + j] score matrices (the reference semantics)."""
    b, t_len = ids.shape
    n = t_len - 1
    idx = torch.arange(n)
    hidden, _ = d.fuse(aux[:, :n])
    causal = idx[None, :] <= idx[:, None]
    scale = 1.0 / math.sqrt(d.cfg.head_dim)
    attn = d.midlayer.self_attn
    out, k0, v0, diag_k, diag_v = [], None, None, [], []
    for j in range(min(unroll, n)):
        q, k, v, res = d.pre_attn(ids[:, (idx + j + 1).clamp(max=t_len - 1)], hidden, (idx + j)[None].expand(b, n))
        k, v = attn.repeat_kv(k), attn.repeat_kv(v)
        if j == 0:
            k0, v0 = k, v
            o = torch.softmax(((q @ k.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf")), -1) @ v
        else:
            diag_k.append(k)
            diag_v.append(v)
            s0 = ((q @ k0.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf"))
            w = torch.softmax(torch.cat([s0] + [(q * kd).sum(-1, keepdim=True) * scale for kd in diag_k], -1), -1)
            o = w[..., :n] @ v0
            for i, vd in enumerate(diag_v):
                o = o + w[..., n + i : n + i + 1] * vd
        lg, hidden = d.post_attn(o, res)
        out.append(lg)
    return out


def _grads(d: SpecExitDraft, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    ps = {k: p for k, p in d.named_parameters() if p.requires_grad}
    return dict(zip(ps, torch.autograd.grad(loss, list(ps.values()))))


@pytest.mark.parametrize("recompute", [False, True])
def test_fused_ttt_attention_matches_dense_scores_values_and_gradients(recompute):
    """Fused causal kernel + log-sum-exp merge of the diagonal terms == the dense softmax over
    [causal block | diagonal keys], in value and in every parameter gradient (fp32, 1e-5);
    recomputing each step in backward changes nothing."""
    d = random_draft(seed=3)
    torch.manual_seed(1)
    ids = torch.randint(0, 50, (2, 11))
    aux = torch.randn(2, 11, 96)
    w = torch.randn(4, 2, 10, 30)
    ref = dense_ttt_logits(d, aux, ids, unroll=4)
    new = [d.head(pre) for _, pre, _ in ttt_unroll(d, aux, ids, unroll=4, recompute=recompute)]
    for r, x in zip(ref, new, strict=True):
        torch.testing.assert_close(x, r, rtol=1e-5, atol=1e-5)
    g_ref = _grads(d, sum((wj * r).sum() for wj, r in zip(w, ref)))
    new = [d.head(pre) for _, pre, _ in ttt_unroll(d, aux, ids, unroll=4, recompute=recompute)]
    g_new = _grads(d, sum((wj * x).sum() for wj, x in zip(w, new)))
    for k in g_ref:
        torch.testing.assert_close(g_new[k], g_ref[k], rtol=1e-5, atol=1e-5, msg=k)


def dense_step_attention(q, k0, v0, diag_k, diag_v, scale):
    """Reference for `ttt_step_attention`: one dense softmax over [causal block | diagonal keys]."""
    n, rep = q.shape[2], q.shape[1] // diag_k[0].shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    s0 = ((q.float() @ k0.float().transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf"))
    sd = [(q.float() * kd.float().repeat_interleave(rep, 1)).sum(-1, keepdim=True) * scale for kd in diag_k]
    w = torch.softmax(torch.cat([s0, *sd], -1), -1)
    o = w[..., :n] @ v0.float()
    for i, vd in enumerate(diag_v):
        o = o + w[..., n + i : n + i + 1] * vd.float().repeat_interleave(rep, 1)
    return o


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32-efficient", "bf16-flash"])
def test_ttt_step_attention_cuda_kernels_match_dense(dtype):
    """On CUDA the causal block runs in the memory-efficient kernel (fp32) or flash (bf16)."""
    torch.manual_seed(0)
    b, nh, nkv, n, d, j = 2, 8, 2, 300, 64, 3
    dev = "cuda"
    q, k0, v0 = (torch.randn(b, nh, n, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    dk = [torch.randn(b, nkv, n, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(j)]
    dv = [torch.randn(b, nkv, n, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(j)]
    leaves = [q, k0, v0, *dk, *dv]
    probe = torch.randn(b, nh, n, d, device=dev)
    ref = dense_step_attention(q, k0, v0, dk, dv, d**-0.5)
    out = ttt_attention.ttt_step_attention(q, k0, v0, dk, dv, d**-0.5)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(out.float(), ref, **tol)
    g_ref = torch.autograd.grad((ref * probe).sum(), leaves)
    g_out = torch.autograd.grad((out.float() * probe).sum(), leaves)
    for a, r in zip(g_out, g_ref):
        torch.testing.assert_close(a.float(), r.float(), **{k: 5 * v for k, v in tol.items()})


def test_causal_lse_kernel_and_fallback_agree_with_dense_in_value_and_gradient():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 8, dtype=torch.float64).float().requires_grad_() for _ in range(3))
    scale = 0.3
    s = ((q @ k.transpose(-1, -2)) * scale).masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    ref = (torch.softmax(s, -1) @ v, torch.logsumexp(s, -1))
    probe = [torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9)]
    g_ref = torch.autograd.grad(sum((p * r).sum() for p, r in zip(probe, ref)), (q, k, v))
    for fused in (ttt_attention._fused_causal, ttt_attention._math_causal):
        o, lse = fused(q, k, v, scale)
        lse = lse + ttt_attention._lse_grad_carrier(q, k, scale)
        torch.testing.assert_close(o, ref[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse, ref[1], rtol=1e-5, atol=1e-5)
        g = torch.autograd.grad(sum((p * r).sum() for p, r in zip(probe, (o, lse))), (q, k, v))
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_chunked_and_recomputed_loss_equal_the_plain_one():
    d = random_draft(seed=4)
    torch.manual_seed(2)
    ids = torch.randint(0, 50, (2, 10))
    aux = torch.randn(2, 10, 96)
    tgt = torch.randn(2, 10, 30)
    mask = (torch.rand(2, 10) > 0.3).float()
    ref, m_ref = ttt_token_loss(d, aux, ids, tgt, mask, LossConfig(unroll=3))
    g_ref = _grads(d, ref)
    for cfg in (LossConfig(unroll=3, loss_chunk_tokens=6), LossConfig(unroll=3, loss_chunk_tokens=4, recompute=True)):
        loss, m = ttt_token_loss(d, aux, ids, tgt, mask, cfg)
        torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
        assert m == pytest.approx(m_ref, rel=1e-5, abs=1e-6)
        g = _grads(d, loss)
        for k in g_ref:
            torch.testing.assert_close(g[k], g_ref[k], rtol=1e-5, atol=1e-6, msg=k)


def test_bf16_autocast_loss_and_gradients_track_fp32():
    """The GPU recipe's precision (bf16 autocast, fp32 weights), here on CPU: close to fp32."""
    d = random_draft(seed=5)
    for p in d.parameters():
        p.data.mul_(0.5)
    torch.manual_seed(3)
    ids = torch.randint(0, 50, (2, 12))
    aux = torch.randn(2, 12, 96)
    tgt = torch.randn(2, 12, 30)
    mask = torch.ones(2, 12)
    cfg = LossConfig(unroll=3, recompute=True)
    ref, _ = ttt_token_loss(d, aux, ids, tgt, mask, cfg)
    g_ref = _grads(d, ref)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = ttt_token_loss(d, aux, ids, tgt, mask, cfg)
    g = _grads(d, loss)
    assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) < 0.03 * ref.item()
    for k in ("fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight", "lm_head.weight"):
        cos = F.cosine_similarity(g[k].flatten(), g_ref[k].flatten(), 0)
        assert g[k].dtype == torch.float32 and cos > 0.98, (k, cos)


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
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first
    assert set(m) >= {"acc_0", "acc_1", "acc_2", "loss_0"}


@pytest.mark.parametrize("mode", ["uncertainty", "ratio", "fixed"])
def test_dynamic_weighting_modes(mode):
    w = DynamicWeighting(LossConfig(weighting=mode))
    tok = torch.tensor(2.0, requires_grad=True)
    sig = {
        k: torch.tensor(v, requires_grad=True) for k, v in [("confidence", 0.5), ("progress", 0.1), ("remaining", 8.0)]
    }
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
    # the hooks keep exactly HF's hidden_states[i] (i = 0 is the embeddings)
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    aux0, _ = target_features(model, ids, mask, (0, 2, 3))
    torch.testing.assert_close(aux0, torch.cat([hf[0], hf[2], hf[3]], -1))
    torch.testing.assert_close(full, model(input_ids=ids, attention_mask=mask).logits.detach())


@torch.no_grad()
@pytest.mark.parametrize("variant", VARIANTS[1:], ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
def test_each_layer_variant_changes_the_drafts_and_has_vllms_tensors(variant):
    """An option is not a no-op, and it brings the parameters vLLM's drafter loads for it."""
    torch.manual_seed(3)
    ids, aux = torch.randint(0, 50, (1, 6)), torch.randn(1, 6, 96)
    plain, other = random_draft(seed=2), random_draft(seed=2, **variant)
    shared = {k: v for k, v in plain.state_dict().items() if k in other.state_dict()}
    other.load_state_dict(shared, strict=False)  # same weights where both have them
    extra = set(other.state_dict()) - set(plain.state_dict())
    for name, m in other.named_modules():  # the variant's own norms at random gains, so each one bites
        if f"{name}.weight" in extra:
            torch.nn.init.normal_(m.weight, mean=1.0, std=0.3)

    def drafts(d):
        hid, _ = d.fuse(aux)
        lg, nxt, cache = d.forward_cached(ids, hid, torch.arange(6)[None], None)
        lg2, _, _ = d.forward_cached(ids[:, -1:], nxt[:, -1:], torch.tensor([[6]]), cache)
        return torch.cat([lg, lg2], 1)

    assert not torch.allclose(drafts(plain), drafts(other), atol=1e-3)
    want = {
        "layer": {"midlayer.self_attn.q_norm.weight", "midlayer.self_attn.k_norm.weight"},
        "norm_before_fc": {"input_norm.weight"},
        "fc_norm": {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"},
    }
    assert extra == set().union(*(want.get(k, set()) for k in variant))


def test_end_weight_weighs_the_confidence_loss_of_the_thinkings_second_half():
    """end_weight w: the confidence term is the mean over think tokens with those from END_FROM of the
    thinking on counted w times; 1 is the plain mean; progress and remaining never change."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(2, 6, 3, generator=g)
    conf = (torch.rand(2, 6, generator=g) > 0.5).float()
    prog = torch.tensor([[0.0, 0.2, 0.4, 0.6, 0.8, 0.0], [0.1, 0.5, 0.9, 0.0, 0.0, 0.0]])
    log_rem = torch.randn(2, 6, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    per_token = torch.nn.functional.binary_cross_entropy_with_logits(raw[..., 0], conf, reduction="none")[mask]
    late = prog[mask] >= END_FROM
    plain = signal_losses(raw, conf, prog, log_rem, mask)
    assert torch.allclose(plain["confidence"], per_token.mean())
    full = torch.nn.functional.binary_cross_entropy_with_logits(raw[..., 0], conf, reduction="none")
    assert torch.equal(
        plain["confidence"], (full * mask.float()).sum() / mask.float().sum()
    )  # the old sum, bit for bit
    heavy = signal_losses(raw, conf, prog, log_rem, mask, end_weight=4.0)
    w = torch.where(late, 4.0, 1.0)
    assert torch.allclose(heavy["confidence"], (per_token * w).sum() / w.sum())
    assert not torch.allclose(heavy["confidence"], plain["confidence"])
    for k in ("progress", "remaining"):
        assert torch.equal(heavy[k], plain[k])
    with pytest.raises(ValueError, match="end_weight"):
        LossConfig(end_weight=0)
