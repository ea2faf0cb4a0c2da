"""Draft checkpoints in the layout vLLM's Eagle3 drafter loads, plus SpecExit <-> stock converters.

Files: `config.json` (see DraftConfig.to_hf_json) and `model.safetensors` with
`fc.weight [H(+3), 3Ht]`, `midlayer.*`, `norm.weight`, `lm_head.weight [N, H]`, `d2t [N]`,
`t2d [V]` and optionally `embed_tokens.weight` (vLLM shares the target's when it is absent).
A SpecExit checkpoint differs from a stock EAGLE-3 one only in `fc.weight`'s 3 extra rows and the
`specexit` block of its config; loading one as the other is an error that names the shapes.
Every write of `config.json` goes through DraftConfig, so its fields (`token_ids`, `exit_defaults`)
survive conversion and updates.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from specexit_core.draft import formats
from specexit_core.draft.config import LAYER_OPTIONS, DraftConfig
from specexit_core.draft.model import SpecExitDraft, expected_shapes
from specexit_core.draft.weights import WEIGHT_FILES, read_tensors
from specexit_core.exit import SIGNALS


class CheckpointMismatch(ValueError):
    """A checkpoint whose tensors do not fit its (or the requested) draft config."""


def save_draft(
    draft: SpecExitDraft, out_dir: str | Path, *, include_embed: bool = True, extra: dict | None = None
) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().contiguous().clone() for k, v in draft.state_dict().items()}
    if not include_embed:
        sd.pop("embed_tokens.weight")
    sd["t2d"] = sd["t2d"].to(torch.bool)
    if draft.cfg.draft_vocab_size == draft.cfg.vocab_size:
        # the draft vocab is the target's: vLLM's eagle3 drafter then has no d2t parameter and refuses one
        # (published full-vocab heads carry none); `load_draft` puts the identity maps back
        if sd["d2t"].any():
            raise ValueError("a full-vocabulary draft must map draft id i to target id i (d2t all zero)")
        sd.pop("d2t"), sd.pop("t2d")
    save_file(sd, str(out / "model.safetensors"))
    cfg = draft.cfg.to_hf_json()
    if extra:
        cfg.update(extra)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def read_config(ckpt_dir: str | Path, *, target_num_layers: int | None = None) -> DraftConfig:
    """`target_num_layers`: for a published head that names no aux layers (vLLM's default then)."""
    cfg_json = json.loads((Path(ckpt_dir) / "config.json").read_text())
    return DraftConfig.from_hf_json(cfg_json, target_num_layers=target_num_layers)


def check_shapes(cfg: DraftConfig, tensors: dict[str, torch.Tensor], where: str = "") -> None:
    """Raise CheckpointMismatch naming the first tensor whose shape disagrees with `cfg`."""
    want = expected_shapes(cfg)
    fc = tuple(tensors["fc.weight"].shape) if "fc.weight" in tensors else None
    h, n_aux_in = cfg.hidden_size, 3 * cfg.target_hidden_size
    if fc is not None and fc != want["fc.weight"]:
        kind = {
            (h, n_aux_in): "a stock EAGLE-3 checkpoint (no signal rows)",
            (h + len(SIGNALS), n_aux_in): "a SpecExit checkpoint (3 signal rows)",
        }.get(fc, "neither a stock EAGLE-3 nor a SpecExit checkpoint")
        fix = (
            "convert it with `specexit draft convert --add-signals`"
            if fc[0] == h
            else "convert it with `specexit draft convert --strip-signals`"
            if fc[0] == h + len(SIGNALS)
            else "check hidden sizes"
        )
        raise CheckpointMismatch(
            f"{where}fc.weight has shape {list(fc)}, expected {list(want['fc.weight'])} for a "
            f"{'SpecExit' if cfg.signals else 'stock EAGLE-3'} draft: this is {kind}; {fix}"
        )
    for k, shape in want.items():
        if k == "embed_tokens.weight" and k not in tensors:
            continue
        if k not in tensors:
            raise CheckpointMismatch(f"{where}missing tensor {k!r} (expected shape {list(shape)})")
        if tuple(tensors[k].shape) != shape:
            raise CheckpointMismatch(f"{where}{k} has shape {list(tensors[k].shape)}, expected {list(shape)}")
    extra = set(tensors) - set(want)
    if extra:
        raise CheckpointMismatch(f"{where}unexpected tensors {sorted(extra)}")


def load_draft(
    ckpt_dir: str | Path,
    *,
    target_embed: torch.Tensor | None = None,
    expect_signals: bool | None = None,
    target_num_layers: int | None = None,
) -> SpecExitDraft:
    """Load a draft (ours or a published head, see weights.py); `expect_signals=True/False` insists
    on a SpecExit / stock checkpoint."""
    ckpt_dir = Path(ckpt_dir)
    cfg = read_config(ckpt_dir, target_num_layers=target_num_layers)
    if expect_signals is not None and bool(cfg.signals) != expect_signals:
        cfg = cfg.replace(signals=SIGNALS if expect_signals else ())
    tensors = read_tensors(ckpt_dir, cfg)
    check_shapes(cfg, tensors, where=f"{ckpt_dir}: ")
    draft = SpecExitDraft(cfg)
    if "embed_tokens.weight" not in tensors:
        if target_embed is None:
            raise CheckpointMismatch(f"{ckpt_dir}: no embed_tokens.weight; pass the target's embedding")
        tensors["embed_tokens.weight"] = target_embed
    draft.load_state_dict({k: v.to(torch.bool) if k == "t2d" else v for k, v in tensors.items()}, strict=True)
    draft.embed_tokens.weight.requires_grad_(False)
    return draft.float().eval()


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    add_signals: bool,
    token_ids: dict | None = None,
    target_num_layers: int | None = None,
    fmt: str = formats.FLAT,
    verifier: str | None = None,
    verifier_architectures: list[str] | None = None,
) -> Path:
    """Stock EAGLE-3 -> SpecExit (zero-initialised signal rows: raw 0 = confidence 0.5, progress 0.5,
    remaining 0) or SpecExit -> stock (signal rows dropped). Other tensors are copied unchanged.
    `src` may be a published head in either layout (weights.py, formats.py); `dst` gets
    `model.safetensors` and a config in layout `fmt` naming its aux layers and layer options (so no
    reader's default decides them). `token_ids` ({think_start, think_end, split}) are what the vLLM
    plugin needs to serve the result; `target_num_layers` resolves a head that names no aux layers;
    `verifier` (+ its architectures): the target the speculators layout names (default: `src`'s)."""
    if fmt not in formats.FORMATS:
        raise ValueError(f"--format {fmt!r}: one of {list(formats.FORMATS)}")
    src, dst = Path(src), Path(dst)
    cfg_json = json.loads((src / "config.json").read_text())
    cfg = DraftConfig.from_hf_json(cfg_json, target_num_layers=target_num_layers)
    if token_ids is not None:
        cfg = cfg.replace(token_ids=dict(token_ids))
    tensors = read_tensors(src, cfg)
    check_shapes(cfg, tensors, where=f"{src}: ")  # the head as it is, before any change
    fc = tensors["fc.weight"]
    if add_signals:
        if cfg.signals or fc.shape[0] != cfg.hidden_size:
            raise CheckpointMismatch(f"{src}: already has signal rows (fc.weight {list(fc.shape)})")
        tensors["fc.weight"] = torch.cat([fc, fc.new_zeros(len(SIGNALS), fc.shape[1])], 0)
        new_cfg = cfg.replace(signals=SIGNALS)
    else:
        if not cfg.signals or fc.shape[0] != cfg.hidden_size + len(SIGNALS):
            raise CheckpointMismatch(f"{src}: has no signal rows to strip (fc.weight {list(fc.shape)})")
        tensors["fc.weight"] = fc[: cfg.hidden_size].contiguous()
        new_cfg = cfg.replace(signals=())
    check_shapes(new_cfg, tensors, where=f"{dst}: ")
    out_json = _config_json(formats.flat_config(cfg_json), new_cfg)
    if fmt == formats.SPECULATORS:
        source = cfg_json.get("speculators_config") or {}
        methods = source.get("proposal_methods") or [{}]
        out_json = formats.speculators_json(
            out_json,
            verifier=verifier or (source.get("verifier") or {}).get("name_or_path"),
            verifier_architectures=verifier_architectures or (source.get("verifier") or {}).get("architectures"),
            speculative_tokens=methods[0].get("speculative_tokens") or formats.DEFAULT_SPECULATIVE_TOKENS,
            extra={k: v for k, v in cfg_json.items() if k in ("speculators_version", "transformers_version")},
        )
        tensors = formats.speculators_tensor_names(tensors)
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(out_json, indent=2) + "\n")
    for extra in src.iterdir():  # keep side files (README, training metadata), not other weights
        weights = extra.name in WEIGHT_FILES or extra.suffix in (".safetensors", ".bin")
        if extra.name != "config.json" and not weights and extra.is_file():
            shutil.copy2(extra, dst / extra.name)
    return dst


def set_exit_defaults(
    ckpt_dir: str | Path,
    exit_defaults: dict | None,
    exit_profiles: dict | None = None,
    exit_efforts: dict | None = None,
) -> DraftConfig:
    """Store ExitConfig overrides as the draft's `specexit.exit_defaults` (None removes them), per
    sampling profile as `specexit.exit_profiles` (a calibrated file's `by_profile`) and per reasoning
    effort level as `specexit.exit_efforts` (its `efforts`; None removes either): the server defaults
    the vLLM plugin starts from."""
    ckpt_dir = Path(ckpt_dir)
    cfg_json = json.loads((ckpt_dir / "config.json").read_text())
    cfg = DraftConfig.from_hf_json(cfg_json)
    if not cfg.signals:
        raise ValueError(f"{ckpt_dir} is a stock EAGLE-3 draft: it has no SpecExit exit to set defaults for")
    new_cfg = cfg.replace(
        exit_defaults=None if exit_defaults is None else dict(exit_defaults),
        exit_profiles=None if exit_profiles is None else dict(exit_profiles),
        exit_efforts=None if exit_efforts is None else dict(exit_efforts),
    )
    _write_config(ckpt_dir, cfg_json, new_cfg)
    return new_cfg


def _write_config(out_dir: Path, base_json: dict, cfg: DraftConfig) -> None:
    """`config.json` = `base_json` updated to what `cfg` says, in `base_json`'s layout."""
    if formats.format_of(base_json) == formats.SPECULATORS:
        out_json = dict(base_json)
        flat = _config_json(formats.flat_config(base_json), cfg)
        out_json["transformer_layer_config"] = formats.transformer_layer_config(flat)  # `specexit` rides there
    else:
        out_json = _config_json(base_json, cfg)
    (out_dir / "config.json").write_text(json.dumps(out_json, indent=2) + "\n")


def _config_json(base_json: dict, cfg: DraftConfig) -> dict:
    """A flat `config.json`: `base_json` (keys DraftConfig does not own are kept, e.g. training metadata)
    with the `specexit` block, `architectures`, aux layer ids and layer options that `cfg` says."""
    owned = (
        "specexit",
        "architectures",
        "model_type",
        "eagle_aux_hidden_state_layer_ids",
        "eagle_config",
        *LAYER_OPTIONS,
    )
    out_json = {k: v for k, v in base_json.items() if k not in owned}
    out_json.update({k: v for k, v in cfg.to_hf_json().items() if k in owned})
    return out_json
