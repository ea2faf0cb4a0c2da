"""A SpecExit draft in the speculators layout (draft/formats.py) keeps its SpecExit drafter in vLLM.

vLLM 0.32's speculators reader (`update_eagle3` in transformers_utils/configs/speculators/algos.py)
names the drafter from `transformer_layer_config.model_type` alone (llama -> Eagle3LlamaForCausalLM,
qwen3 -> Eagle3Qwen3ForCausalLM), which would load a SpecExit head's widened `fc` into a stock drafter.
We wrap that updater: when the layer config carries a `specexit` block with the signals, the drafter is
the SpecExit one for that layer. Any other speculators head is read exactly as vLLM reads it.
"""

from __future__ import annotations

from specexit_core.draft.config import ARCHES, read_specexit_fields
from specexit_core.exit import SIGNALS

_WRAPPED = "_specexit_wrapped"


def specexit_architectures(pre_trained_config: dict) -> list[str] | None:
    """The SpecExit drafter for a speculators head's converted config, or None for a stock head."""
    if read_specexit_fields(pre_trained_config).signals != SIGNALS:
        return None
    return [ARCHES[pre_trained_config.get("model_type", "llama")][1]]


def install_speculators_format() -> None:
    from vllm.transformers_utils.configs.speculators import algos

    stock = algos.SUPPORTED_SPECULATORS_TYPES["eagle3"]
    if getattr(stock, _WRAPPED, False):
        return

    def update_eagle3(config_dict: dict, pre_trained_config: dict) -> None:
        stock(config_dict=config_dict, pre_trained_config=pre_trained_config)
        archs = specexit_architectures(pre_trained_config)
        if archs is not None:
            pre_trained_config["architectures"] = archs

    setattr(update_eagle3, _WRAPPED, True)
    algos.SUPPORTED_SPECULATORS_TYPES["eagle3"] = update_eagle3
