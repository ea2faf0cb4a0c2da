"""Reading a draft's tensors as published EAGLE-3 heads ship them, fitted to its DraftConfig.

Published heads come as `model.safetensors` (SpecForge, AngelSlim), a sharded
`model.safetensors.index.json`, or `pytorch_model.bin` (the EAGLE authors' `yuhuili/EAGLE3-*`
heads), read with `torch.load(weights_only=True)` (tensors only, never pickled code). Their tensor
names are ours (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`, optional `embed_tokens`);
speculators-format heads say `layers.0.*` for `midlayer.*`. What a head may lack, vLLM
(llama_eagle3.py) fills the same way: no `d2t`/`t2d` when the draft vocab is the target's; no `t2d`
(vLLM skips it) when `d2t` is there. Tensors no drafter reads (e.g. an old `rotary_emb.inv_freq`)
are dropped with a log note; a tensor we need with the wrong shape is an error (`check_shapes`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file

from specexit_core.draft.config import DraftConfig
from specexit_core.draft.model import expected_shapes

log = logging.getLogger(__name__)

SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN)  # looked for in this order
_ALIASES = {"layers.0.": "midlayer."}  # speculators format -> ours (vLLM maps both to layers.0.)


def read_weight_files(ckpt_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a draft folder, from the first of WEIGHT_FILES it has, as stored (no renaming)."""
    d = Path(ckpt_dir)
    if (d / SAFETENSORS).exists():
        return load_file(str(d / SAFETENSORS))
    if (d / SAFETENSORS_INDEX).exists():
        shards = sorted(set(json.loads((d / SAFETENSORS_INDEX).read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(d / shard)).items()}
    if (d / TORCH_BIN).exists():
        return torch.load(d / TORCH_BIN, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{d}: no draft weights (looked for {', '.join(WEIGHT_FILES)})")


def fit_tensors(cfg: DraftConfig, tensors: dict[str, torch.Tensor], where: str = "") -> dict[str, torch.Tensor]:
    """Published-head tensors -> the names SpecExitDraft(cfg) has: aliases renamed, missing vocab maps
    filled as vLLM fills them, unused tensors dropped (logged). Shapes are left to `check_shapes`."""
    want = expected_shapes(cfg)
    out = {}
    for name, t in tensors.items():
        for old, new in _ALIASES.items():
            if name.startswith(old):
                name = new + name[len(old) :]
        out[name] = t
    if "d2t" not in out:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise ValueError(
                f"{where}no d2t: a draft vocab of {cfg.draft_vocab_size} < {cfg.vocab_size} target tokens needs "
                "the draft -> target id map"
            )
        out["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)  # identity, as vLLM has no map then
    if "t2d" not in out and tuple(out["d2t"].shape) == (cfg.draft_vocab_size,):  # else check_shapes names d2t
        d2t = out["d2t"].long()  # vLLM never reads t2d; it is d2t's image
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(len(d2t)) + d2t] = True
        out["t2d"] = t2d
    unused = sorted(set(out) - set(want))
    if unused:
        log.info("%signoring %d tensor(s) no EAGLE-3 drafter reads: %s", where, len(unused), unused)
    return {k: v for k, v in out.items() if k in want}


def read_tensors(ckpt_dir: str | Path, cfg: DraftConfig) -> dict[str, torch.Tensor]:
    """`read_weight_files` fitted to `cfg` (`fit_tensors`)."""
    return fit_tensors(cfg, read_weight_files(ckpt_dir), where=f"{ckpt_dir}: ")
