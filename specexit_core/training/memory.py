"""Peak memory of one draft-training worker, from shapes alone (no model, no device).

`estimate_train_memory(TrainShape(...))` follows what `train_step` keeps alive, tensor by tensor:

- static: the frozen target's weights, the draft's frozen embedding (fp32), its trainable
  parameters (fp32) with AdamW's two moments, DDP's gradient buckets (one more fp32 copy of the
  gradients when world size > 1);
- target features of the batch: aux hidden states [N, 3 Ht] and the draft-vocab logits [N, Vd]
  (the target's dtype under autocast, fp32 otherwise), N = batch x sequence tokens;
- the unroll: what autograd saves per step (norm inputs and outputs, q/k/v and their RoPE tables,
  attention outputs and log-sum-exps, the MLP's four intermediate-size tensors), the per-step
  outputs later steps read (pre-norm hidden, keys/values), the loss chunks' softmax/log-softmax,
  and the bf16 weight copies autocast makes;
- backward: parameter gradients (fp32), gradients of the kept keys/values, and either the whole
  unroll's saved activations (no recompute) or one step's recomputed ones (recompute);
- the optimizer step: gradients plus one fp32 parameter-sized temporary of AdamW.

The peak is the largest phase. `tests/unit/test_train_memory.py` checks the estimate against
tensor bytes counted while a real step runs at reduced size (`live_bytes.LiveTensorBytes`);
`scripts/gpu_train_probe.py` sets it beside `torch.cuda.max_memory_allocated` at full size.
Kernel workspaces and the CUDA caching allocator's rounding and fragmentation are not in it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specexit_core.draft.config import DraftConfig

GB = 1e9


@dataclass(frozen=True)
class TargetShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_hf(cls, cfg) -> TargetShape:
        """From a transformers config (Llama / Qwen-style decoder)."""
        return cls(
            hidden=cfg.hidden_size,
            layers=cfg.num_hidden_layers,
            heads=cfg.num_attention_heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            intermediate=cfg.intermediate_size,
            vocab=cfg.vocab_size,
            tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        )

    @property
    def params(self) -> int:
        h, d = self.hidden, self.head_dim
        attn = h * self.heads * d * 2 + h * self.kv_heads * d * 2 + 2 * d  # q, o, k, v (+ q/k norms)
        layer = attn + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h


@dataclass(frozen=True)
class TrainShape:
    """What one worker's peak depends on. `autocast`: bf16 autocast for the draft (weights and
    optimizer stay fp32); `recompute`: `LossConfig.recompute`."""

    target: TargetShape
    draft: DraftConfig
    batch_size: int
    seq_len: int
    unroll: int = 7
    target_dtype_bytes: int = 2
    autocast: bool = True
    recompute: bool = True
    world_size: int = 1
    loss_chunk_tokens: int = 2048


@dataclass(frozen=True)
class MemoryEstimate:
    peak: int  # bytes
    phase: str  # the phase that sets it: target | forward | backward | optimizer
    phases: dict[str, int]  # each phase's peak, bytes
    parts: dict[str, int]  # named terms (bytes), for the table

    def as_json(self) -> dict:
        return asdict(self)


def draft_param_counts(dc: DraftConfig) -> tuple[int, int, int]:
    """(trainable, of which weight matrices, of which the decoder layer's matrices)."""
    h, qd, kd = dc.hidden_size, dc.num_attention_heads * dc.head_dim, dc.num_key_value_heads * dc.head_dim
    layer = 2 * h * (qd + 2 * kd) + qd * h + 3 * h * dc.intermediate_size
    mats = 3 * dc.target_hidden_size * dc.fc_out + layer + dc.draft_vocab_size * h
    return mats + 4 * h + dc.n_signals, mats, layer


def _step_saved(s: TrainShape, j: int, a: int) -> int:
    """Bytes per token autograd keeps for unroll step j's decoder layer (a: activation bytes)."""
    dc = s.draft
    h, d, nh, i = dc.hidden_size, dc.head_dim, dc.num_attention_heads, dc.intermediate_size
    qd = nh * d
    low = a == 2  # bf16: norms keep their fp32 input copy and a bf16 normalized copy
    b = 4 * h  # input_layernorm: normalized embedding (fp32; the embedding has no gradient)
    b += (6 * h if low else 4 * h) + 4  # hidden_norm: fp32 input copy + normalized, rsqrt
    b += 2 * h * a  # [emb ; hidden] into q/k/v
    b += 4 * d * a  # RoPE cos/sin tables of q and k
    b += qd * a  # rotated q
    b += qd * a + 4 * nh  # attention output and its log-sum-exp
    if j >= 1:  # log-sum-exp gradient carrier, merged output, per-head scalars of the merge
        b += 2 * qd * a + 4 * nh + 4 * nh * (2 * j + 3)
    b += (6 * h if low else 8 * h) + 4  # post_attention_layernorm (fp32: its input is the residual)
    b += h * a  # MLP input
    b += 4 * i * a  # gate, up, silu(gate), silu(gate) * up
    return b


def estimate_train_memory(s: TrainShape) -> MemoryEstimate:
    """Peak bytes of one worker at `s` (see the module docstring for what is counted)."""
    dc, t = s.draft, s.target
    h, d, nh, nkv, i = dc.hidden_size, dc.head_dim, dc.num_attention_heads, dc.num_key_value_heads, dc.intermediate_size
    qd, kd, vd, ht, u = nh * d, nkv * d, dc.draft_vocab_size, dc.target_hidden_size, s.unroll
    n = s.batch_size * s.seq_len
    a = 2 if s.autocast else 4
    tb = s.target_dtype_bytes
    fb = tb if s.autocast else 4  # features' dtype
    n_train, n_mats, n_layer = draft_param_counts(dc)
    chunk = min(n, max(1, s.loss_chunk_tokens // s.batch_size) * s.batch_size)

    p = {
        "target_weights": t.params * tb,
        "draft_frozen": dc.vocab_size * h * 4 + vd * 8 + dc.vocab_size,  # embedding, d2t, t2d
        "draft_params": n_train * 4,
        "adam_moments": n_train * 8,
        "ddp_buckets": n_train * 4 if s.world_size > 1 else 0,
        "features": n * (3 * ht + vd) * fb,
        "unroll_kept": n
        * (
            (h + dc.n_signals) * a
            + (3 * ht * 2 if s.autocast and fb == 4 else 0)
            + u * h * a
            + 2 * qd * a
            + (u - 1) * 2 * kd * a
            + u * 12
        ),
        "unroll_saved": n * sum(_step_saved(s, j, a) for j in range(u)) if not s.recompute else 0,
        "autocast_weight_copies": n_mats * 2 if s.autocast else 0,
        # weight gradients while the unroll runs backward: under autocast they gather on the bf16
        # weight copies (fp32 gradients appear one by one at the end), else on the fp32 weights
        "weight_grads": (n_layer + vd * h) * a,
        "kv_grads": n * (2 * qd + (u - 1) * 2 * kd + h) * a,
        "one_step_saved": n * _step_saved(s, u - 1, a),
        # one loss chunk (recomputed in backward): its fp32 logits, log-softmax, target softmax and
        # CE product, the norm before the head, and the head's bf16 weight copy
        "loss_chunk": chunk * (16 * vd + 8 * h + 4) + (vd * h * 2 if s.autocast else 0),
        "grads": n_train * 4,
        "optimizer_temp": n_train * 4,
    }
    static = p["target_weights"] + p["draft_frozen"] + p["draft_params"] + p["adam_moments"] + p["ddp_buckets"]
    kept = static + p["features"] + p["unroll_kept"]

    target_layer = n * (3 * t.intermediate * tb + 2 * t.hidden * tb + 8 * t.hidden)
    target_end = n * (3 * ht + vd) * (tb + (fb if fb != tb else 0)) + vd * t.hidden * tb
    phases = {"target": static + n * 3 * ht * tb + max(target_layer, target_end)}
    if s.recompute:  # forward keeps only the per-step outputs; backward recomputes one step at a time
        step_fwd = n * (4 * i * a + 8 * h)  # the MLP's intermediates and norm temporaries of the running step
        phases["forward"] = kept + p["autocast_weight_copies"] + max(step_fwd, p["loss_chunk"])
        step = p["one_step_saved"] + n * 2 * i * a + (n_layer * 2 if s.autocast else 0)  # + MLP grads, copies
        phases["backward"] = kept + p["weight_grads"] + p["kv_grads"] + max(step, p["loss_chunk"])
    else:
        saved = kept + p["unroll_saved"] + p["autocast_weight_copies"]
        phases["forward"] = saved + p["loss_chunk"]
        phases["backward"] = saved + p["weight_grads"] + p["loss_chunk"]
    phases["optimizer"] = static + p["features"] + p["grads"] + p["optimizer_temp"]
    phase = max(phases, key=phases.get)
    return MemoryEstimate(peak=phases[phase], phase=phase, phases=phases, parts=p)
