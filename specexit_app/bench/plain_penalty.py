"""The windowed contextual penalty on a plain vLLM engine (no speculative decoding): the baseline of
`specexit bench longgen`'s penalised vLLM rows.

The long mode applies the penalty in the SpecExit runner hook, which runs only on engines with a SpecExit
draft; a plain engine has no hook, and vLLM's own `repetition_penalty` has no window. Without speculative
decoding vLLM V1 accepts custom logits processors, so this one applies the same formula
(`longgen.plain.next_token_logits`: positive logits / theta, negative * theta, over the last W tokens of
prompt + output) to each request that asks for it: `SamplingParams(extra_args={"plain_penalty": {"theta":
1.2, "window": 64}})` on an engine built with `logits_processors=[WindowedPenaltyLogitsProcessor]`. Greedy
output then equals `plain.plain_decode(..., penalty=...)`.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from specexit_core.longgen.penalty import PenaltyConfig
from specexit_core.longgen.plain import next_token_logits

KEY = "plain_penalty"


def window_context(prompt_ids, output_ids, window: int) -> list[int]:
    """The last `window` tokens of prompt + output, without copying the whole sequence."""
    tail = list(output_ids[-window:]) if window > 0 else []
    if len(tail) < window:
        tail = list(prompt_ids[len(prompt_ids) - (window - len(tail)) :] if window - len(tail) else []) + tail
    return tail


class WindowedPenaltyLogitsProcessor(AdapterLogitsProcessor):
    """Per request: `extra_args["plain_penalty"]` = PenaltyConfig fields; requests without it are untouched."""

    def is_argmax_invariant(self) -> bool:
        return False  # the penalty changes greedy output

    def new_req_logits_processor(self, params):
        spec = (params.extra_args or {}).get(KEY)
        if not spec:
            return None
        pen = PenaltyConfig.model_validate(spec)
        if not pen.enabled:
            return None

        def apply(prompt_ids, output_ids, logits: torch.Tensor) -> torch.Tensor:
            ctx = window_context(prompt_ids, output_ids, pen.window)
            return next_token_logits(logits, ctx, pen).to(logits.dtype)

        return apply
