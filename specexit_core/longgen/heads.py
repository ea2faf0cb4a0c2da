"""TokenSwift's multi-token draft heads: gamma chained residual blocks on the target's pre-norm hidden state.

Head i (1..gamma) predicts the token i positions after the one the target's own LM head predicts:
    h_0 = the target's last hidden state before its final norm
    h_i = h_{i-1} + W_i(RMSNorm_i(h_{i-1}))          (W_i: Linear(H, H, no bias))
    logits_i = lm_head(RMSNormOut_i(h_i))             (the target's LM head, shared and frozen)
The linear layers start at zero, so an untrained head repeats the target's own prediction (a harmless draft
that is usually rejected). The heads' own weights are saved as `config.json` + `model.safetensors`
(`save_heads` / `load_heads`), the format the head-training stage (pipelines/train_heads) writes; its
config.json also records what they were trained on (`HeadsConfig.training`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specexit_core.typed_config import StrictModel

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class HeadsConfig(StrictModel):
    hidden_size: int
    num_heads: int = 3  # gamma
    rms_norm_eps: float = 1e-6
    # What trained them, as the head-training stage records it (pipelines/train_heads): the target
    # (path or hub id and a content fingerprint), steps, final loss. None for heads trained in process.
    training: dict[str, Any] | None = None


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


class _Head(nn.Module):
    def __init__(self, cfg: HeadsConfig):
        super().__init__()
        self.norm_in = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        nn.init.zeros_(self.proj.weight)
        self.norm_out = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DraftHeads(nn.Module):
    def __init__(self, cfg: HeadsConfig):
        super().__init__()
        self.cfg = cfg
        self.heads = nn.ModuleList(_Head(cfg) for _ in range(cfg.num_heads))

    def forward(self, pre_norm: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """pre_norm [..., H] -> logits [gamma, ..., V] (float32)."""
        out, h = [], pre_norm
        for head in self.heads:
            h = h + head.proj(head.norm_in(h))
            out.append(lm_head(head.norm_out(h)).float())
        return torch.stack(out)


def heads_for(target, num_heads: int = 3) -> DraftHeads:
    """Fresh (untrained) heads sized for a `target.Target`, on its device and dtype."""
    cfg = HeadsConfig(hidden_size=target.hidden_size, num_heads=num_heads, rms_norm_eps=target.rms_norm_eps)
    return DraftHeads(cfg).to(device=target.device, dtype=target.dtype).eval()


def save_heads(heads: DraftHeads, out_dir: str | Path) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_NAME).write_text(json.dumps(heads.cfg.model_dump(), indent=2) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}, str(out / WEIGHTS_NAME))
    return out


def load_heads(path: str | Path, device=None, dtype=None) -> DraftHeads:
    from safetensors.torch import load_file

    path = Path(path)
    heads = DraftHeads(HeadsConfig.model_validate_json((path / CONFIG_NAME).read_text()))
    heads.load_state_dict(load_file(str(path / WEIGHTS_NAME)))
    return heads.to(device=device, dtype=dtype).eval()
