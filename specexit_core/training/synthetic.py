"""A randomly initialised target, its SpecExit draft and random token batches, for measuring a
training step's memory and time at a recipe's real shape without weights, data or network
(`scripts/gpu_train_probe.py`, `tests/unit/test_train_memory.py`).

Random weights change nothing the probes measure: the step runs the same kernels on the same
shapes whatever the values.
"""

from __future__ import annotations

import torch

from specexit_core.draft.config import DraftConfig
from specexit_core.draft.model import SpecExitDraft
from specexit_core.training.step import DraftBatch


def random_target(hf_config: dict, *, dtype: torch.dtype, device: str | torch.device = "cpu"):
    """A transformers causal LM built from a config dict (`model_type` names the architecture),
    random weights, frozen, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(hf_config)
    tc = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(tc, dtype=dtype)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def random_draft(target, *, aux_layer_ids, draft_vocab_size: int, device: str | torch.device = "cpu") -> SpecExitDraft:
    """A SpecExit draft shaped for `target` (fp32, random weights, frozen embedding); its draft
    vocabulary is every k-th target id."""
    dcfg = DraftConfig.for_target(target.config, aux_layer_ids=aux_layer_ids, draft_vocab_size=draft_vocab_size)
    draft = SpecExitDraft(dcfg)
    stride = dcfg.vocab_size // draft_vocab_size
    with torch.no_grad():
        draft.d2t.copy_(torch.arange(draft_vocab_size) * (stride - 1))
        draft.t2d.zero_()
        draft.t2d[torch.arange(draft_vocab_size) * stride] = True
    draft.embed_tokens.weight.requires_grad_(False)
    return draft.to(device)


def random_batch(
    batch_size: int, seq_len: int, vocab_size: int, *, seed: int = 0, device: str | torch.device = "cpu"
) -> DraftBatch:
    """Full-length rows (no padding: the memory peak), token loss and signal labels on every token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g)
    ones = torch.ones(batch_size, seq_len)
    labels = torch.rand(batch_size, seq_len, generator=g)
    batch = DraftBatch(
        input_ids=ids,
        attention_mask=ones.long(),
        loss_mask=ones,
        confidence=labels,
        progress=labels.clone(),
        log_remaining=labels * 5,
        think_mask=ones.bool(),
    )
    return DraftBatch(*(getattr(batch, f).to(device) for f in DraftBatch.__dataclass_fields__))
