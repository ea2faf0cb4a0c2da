"""An output layer that skips its all-zero rows (vLLM-CPU): exact, and ~2x a realistic teacher's step.

The built-in realistic teachers (qwen3-like, r1-llama-like) carry real 151,936 / 128,256-id
vocabularies but write a few hundred ids; every other embedding row is exactly zero
(specexit_core/teachers/restricted_vocab.py). vLLM's LM head still multiplies every row: on 2 cores it
was 46% of the engine's step (docs/cpu-stack.md). A zero row's logit is exactly 0 (no bias), so
computing the non-zero rows and writing 0 everywhere else gives the same logits; the sampler, the
logprobs and every token id still see the whole vocabulary.

Only where it pays and is exact: a CPU head (vLLM's CPU GEMM dispatch, `layer.cpu_linear`), 2-D, no
bias, at least `MIN_ZERO_FRACTION` of its rows zero. A real model has (almost) no zero rows and keeps
vLLM's GEMM untouched. `SPECEXIT_ZERO_ROW_HEAD=0` turns it off (for an A/B, studies/bench_zero_row_head.py).
The non-zero rows' dot products run in a different GEMM call than vLLM's, so a logit may differ from
the dense head's in its last bits (as between any two GEMM kernels); greedy ties at that level are the
only place it could show.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger("specexit.vllm")

MIN_ZERO_FRACTION = 0.5  # below this the dense GEMM is cheap enough and nothing changes
ENV_SWITCH = "SPECEXIT_ZERO_ROW_HEAD"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def nonzero_rows(weight: torch.Tensor) -> torch.Tensor:
    """Indices of the rows of `weight` that hold any non-zero value."""
    return torch.nonzero(weight.detach().ne(0).any(dim=1)).flatten()


def zero_row_linear(weight: torch.Tensor, rows: torch.Tensor):
    """`x -> x @ weight.T` computed on `rows` only (the others are zero rows: logit exactly 0)."""
    sub = weight.detach().index_select(0, rows).contiguous()
    n_out = weight.shape[0]

    def linear(x: torch.Tensor, _weight=None, bias=None) -> torch.Tensor:
        if bias is not None:  # a bias would make a zero row's logit non-zero: never installed so
            raise RuntimeError("zero-row head called with a bias")
        flat = x.reshape(-1, x.shape[-1])
        out = flat.new_zeros((flat.shape[0], n_out))
        out.index_copy_(1, rows, torch.nn.functional.linear(flat, sub))
        return out.reshape(*x.shape[:-1], n_out)

    linear.rows_computed = (rows.numel(), n_out)  # what `head_rows` reports
    return linear


def maybe_install(layer: torch.nn.Module) -> bool:
    """Replace `layer.cpu_linear` by the zero-row head where that is exact and pays; True if done."""
    weight = getattr(layer, "weight", None)
    if not enabled() or not hasattr(layer, "cpu_linear") or weight is None or weight.ndim != 2:
        return False
    if weight.is_meta or getattr(layer, "bias", None) is not None:
        return False
    rows = nonzero_rows(weight)
    zero_fraction = 1.0 - rows.numel() / weight.shape[0]
    if zero_fraction < MIN_ZERO_FRACTION or rows.numel() == 0:
        return False
    layer.cpu_linear = zero_row_linear(weight, rows)
    log.info(
        "specexit: LM head computes %d of %d rows (the rest are zero rows, logit 0)", rows.numel(), weight.shape[0]
    )
    return True


def install_zero_row_head() -> bool:
    """Wrap vLLM's unquantized embedding method so an LM head gets the zero-row path after loading."""
    from vllm.model_executor.layers import vocab_parallel_embedding as vpe
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    method = vpe.UnquantizedEmbeddingMethod
    if getattr(method, "_specexit_zero_rows", False):
        return True
    orig = method.process_weights_after_loading

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        orig(self, layer)
        if isinstance(layer, vpe.ParallelLMHead):  # not the input embedding: its lookup is already cheap
            maybe_install(layer)

    method.process_weights_after_loading = process_weights_after_loading
    method._specexit_zero_rows = True
    # worker method for `collective_rpc("specexit_head_rows")` (a string: no pickled function needed)
    from vllm.v1.worker.worker_base import WorkerBase

    WorkerBase.specexit_head_rows = head_rows
    return True


def head_rows(worker) -> list[int] | None:
    """For `collective_rpc`: [rows computed, rows] of this worker's LM head if it is a zero-row
    head, else None (vLLM's dense head)."""
    head = getattr(worker.model_runner.model, "lm_head", None)
    got = getattr(getattr(head, "cpu_linear", None), "rows_computed", None)
    return list(got) if got is not None else None
