"""The two layouts published EAGLE-3 heads ship their `config.json` in, read and written as vLLM 0.32 does.

- **flat**: a transformers-style config of the one draft layer with the EAGLE-3 keys beside it
  (`draft_vocab_size`, `eagle_config`, ...): SpecForge, AngelSlim, the EAGLE authors' `yuhuili/EAGLE3-*`
  heads and this repository's drafts. vLLM wraps it in its `EAGLEConfig`.
- **speculators**: vllm-project/speculators' layout (RedHatAI's `*-speculator.eagle3` heads):
  `speculators_model_type: eagle3`, the layer's config under `transformer_layer_config`, the EAGLE-3
  keys at the top level and `speculators_config` naming the verifier (the target) that `vllm serve
  FOLDER` serves. vLLM's reader (transformers_utils/configs/speculators/algos.py, `update_eagle3`)
  turns it into the flat config its drafter sees, with its own defaults: `norm_before_residual` is True
  when absent (False in the flat layout), and `transformer_layer_config.model_type` picks the layer.

`flat_config` is that reading (every other reader of a draft config goes through it);
`speculators_json` writes a draft in the speculators layout. Tensor names: the flat layout's
`midlayer.*` are `layers.0.*` in the speculators one (`SPECULATORS_TENSOR_PREFIX`). The fields of
each, with the published families: docs/draft_formats.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FLAT, SPECULATORS = "flat", "speculators"
FORMATS = (FLAT, SPECULATORS)
# update_eagle3's defaults for the layer options a speculators config leaves out
SPECULATORS_DEFAULTS = {"norm_before_residual": True, "norm_before_fc": False, "fc_norm": False, "norm_output": False}
# transformer_layer_config.model_type -> the architecture update_eagle3 gives the drafter
SPECULATORS_LAYER_ARCH = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}
SPECULATORS_ARCH = "Eagle3Speculator"  # the top-level architecture of a speculators EAGLE-3 head
SPECULATORS_TENSOR_PREFIX = ("midlayer.", "layers.0.")  # flat name prefix -> speculators name prefix
DEFAULT_SPECULATIVE_TOKENS = 3  # proposal_methods[0].speculative_tokens when a source names none
# top-level keys of a speculators config that are not the layer's (what `flat_config` moves)
_EAGLE3_KEYS = ("draft_vocab_size", "target_hidden_size", *SPECULATORS_DEFAULTS, "eagle_aux_hidden_state_layer_ids")


def format_of(d: Mapping[str, Any]) -> str:
    """FLAT or SPECULATORS: vLLM takes a config with a `speculators_config` for the speculators layout."""
    return SPECULATORS if d.get("speculators_config") is not None else FLAT


def flat_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """A draft `config.json` in either layout -> the flat config vLLM 0.32's drafter gets. A speculators
    one as `update_eagle3` converts it; our `specexit` block rides in `transformer_layer_config` (the
    part vLLM hands the drafter), or at the top level."""
    if format_of(d) == FLAT:
        return dict(d)
    kind = d.get("speculators_model_type")
    if kind != "eagle3":
        raise ValueError(f"speculators_model_type {kind!r}: only EAGLE-3 heads (eagle3) become SpecExit drafts")
    layer = d.get("transformer_layer_config")
    if not isinstance(layer, Mapping):
        raise ValueError("speculators config has no transformer_layer_config (the draft layer's shape)")
    out = dict(layer)
    model_type = out.get("model_type", "llama")
    if model_type not in SPECULATORS_LAYER_ARCH:
        raise ValueError(
            f"speculators transformer_layer_config.model_type {model_type!r}: vLLM 0.32 reads "
            f"{sorted(SPECULATORS_LAYER_ARCH)}"
        )
    out["architectures"] = [SPECULATORS_LAYER_ARCH[model_type]]
    out["draft_vocab_size"] = d.get("draft_vocab_size")
    if d.get("target_hidden_size") is not None:
        out["target_hidden_size"] = d["target_hidden_size"]
    for key, default in SPECULATORS_DEFAULTS.items():
        out[key] = d.get(key, default)
    if d.get("eagle_aux_hidden_state_layer_ids"):
        out["eagle_aux_hidden_state_layer_ids"] = d["eagle_aux_hidden_state_layer_ids"]
    if "specexit" not in out and d.get("specexit"):
        out["specexit"] = d["specexit"]
    return out


def speculators_json(
    flat: Mapping[str, Any],
    *,
    verifier: str | None,
    verifier_architectures: list[str] | None = None,
    speculative_tokens: int = DEFAULT_SPECULATIVE_TOKENS,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A flat draft config (DraftConfig.to_hf_json) in the speculators layout: `flat_config` of the
    result gives back what the drafter reads. `verifier` is the target `vllm serve FOLDER` serves;
    `extra`: top-level keys to keep (e.g. a source's `speculators_version`)."""
    if not verifier:
        raise ValueError(
            "the speculators layout names its verifier (the target `vllm serve` serves): give --target TARGET_DIR"
        )
    layer = transformer_layer_config(flat)
    out: dict[str, Any] = dict(extra or {})
    out.update(
        {
            "architectures": [SPECULATORS_ARCH],
            "speculators_model_type": "eagle3",
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [
                    {
                        "proposal_type": "greedy",
                        "speculative_tokens": int(speculative_tokens),
                        "verifier_accept_k": 1,
                        "accept_tolerance": 0.0,
                    }
                ],
                "verifier": {"name_or_path": str(verifier), "architectures": list(verifier_architectures or [])},
            },
            "transformer_layer_config": layer,
            **{k: flat[k] for k in _EAGLE3_KEYS if flat.get(k) is not None},
            "torch_dtype": flat.get("torch_dtype", "float32"),
        }
    )
    return out


def transformer_layer_config(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The speculators layout's `transformer_layer_config` of a flat draft config: the layer's own keys
    (our `specexit` block included: vLLM hands this part to the drafter), not the EAGLE-3 ones."""
    return {k: v for k, v in flat.items() if k not in (*_EAGLE3_KEYS, "architectures", "eagle_config", "torch_dtype")}


def speculators_tensor_names(tensors: dict) -> dict:
    """Flat tensor names -> the speculators layout's (`midlayer.*` -> `layers.0.*`)."""
    old, new = SPECULATORS_TENSOR_PREFIX
    return {(new + k[len(old) :] if k.startswith(old) else k): v for k, v in tensors.items()}
