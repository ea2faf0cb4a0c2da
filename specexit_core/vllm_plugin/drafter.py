"""The SpecExit drafters inside vLLM: stock Eagle3 Llama / Qwen3 with `fc` widened by the 3 signal rows.

`combine_hidden_states` hands the proposer only the first H outputs (what a stock drafter
computes); the runner hook reads the signal rows itself (`signal_weight`) on the verified rows,
from `fc_input` of the target features (normalised as fc's input is, under norm_before_fc / fc_norm).
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
from vllm.model_executor.models.qwen3_eagle3 import Eagle3Qwen3ForCausalLM
from vllm.model_executor.models.utils import maybe_prefix

from specexit_core.draft.config import read_specexit_fields
from specexit_core.exit import SIGNALS


class _SpecExitRows:
    """What both SpecExit drafters add to vLLM's: the signal rows of `fc` and how to read them."""

    def _widen_fc(self, vllm_config: VllmConfig, prefix: str) -> None:
        spec = read_specexit_fields(self.config)
        if spec.signals != SIGNALS:
            raise ValueError(
                f"{type(self).__name__} needs a SpecExit draft config (specexit.signals = "
                f"{list(SIGNALS)}); got {getattr(self.config, 'specexit', None)!r}"
            )
        inner = self.model
        self.hidden_size = self.config.hidden_size
        inner.fc = ReplicatedLinear(
            input_size=inner.fc_input_size,
            output_size=self.hidden_size + len(SIGNALS),
            bias=False,
            params_dtype=vllm_config.model_config.dtype,
            quant_config=None,
            prefix=maybe_prefix(maybe_prefix(prefix, "model"), "fc"),
            return_bias=False,
        )
        self.specexit = spec
        # fc's input is the raw target features unless a norm option is on (then `fc_input` applies it)
        self.plain_fc_input = not inner.norm_before_fc and inner.fc_norm is None

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().combine_hidden_states(hidden_states)[..., : self.hidden_size]

    def fc_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The concatenated target features -> what fc multiplies, as `combine_hidden_states` makes it."""
        inner = self.model
        if inner.norm_before_fc:
            hidden_states = inner.input_norm(hidden_states)
        if inner.fc_norm is not None:
            chunks = hidden_states.chunk(len(inner.fc_norm), dim=-1)
            hidden_states = torch.cat([norm(c) for norm, c in zip(inner.fc_norm, chunks)], dim=-1)
        return hidden_states

    def load_weights(self, weights):
        out = super().load_weights(weights)
        # Keep our own copy of the 3 signal rows: backends may repack `fc.weight` after loading
        # (vLLM's CPU backend swaps it for a oneDNN handle and leaves an empty tensor).
        self._signal_weight = self.model.fc.weight[self.hidden_size :].detach().clone().float()
        return out

    def signal_weight(self) -> torch.Tensor:
        """[3, 3*Ht] raw signal rows of fc (confidence, progress, remaining), float32."""
        return self._signal_weight


class SpecExitEagle3LlamaForCausalLM(_SpecExitRows, Eagle3LlamaForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._widen_fc(vllm_config, prefix)


class SpecExitEagle3Qwen3ForCausalLM(_SpecExitRows, Eagle3Qwen3ForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._widen_fc(vllm_config, prefix)
