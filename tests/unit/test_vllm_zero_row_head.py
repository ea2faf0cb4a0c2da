"""vllm_plugin/zero_row_head.py without an engine: the head that skips all-zero rows gives the dense
head's logits, and is installed only where that is exact (no bias) and pays (mostly zero rows)."""

import pytest
import torch

from specexit_core.vllm_plugin import zero_row_head as zr


def head(n_rows=1000, used=(3, 17, 500, 999), hidden=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.zeros(n_rows, hidden)
    w[list(used)] = torch.randn(len(used), hidden, generator=g)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    layer.bias = None
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)
    return layer


@pytest.mark.parametrize("shape", [(5, 32), (2, 3, 32), (0, 32)])
def test_zero_row_head_equals_the_dense_head(shape):
    layer = head()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    dense = layer.cpu_linear(x, layer.weight, None)
    assert zr.maybe_install(layer)
    sparse = layer.cpu_linear(x, layer.weight, None)
    assert sparse.shape == dense.shape and sparse.dtype == dense.dtype
    torch.testing.assert_close(sparse, dense, rtol=1e-6, atol=1e-6)
    assert bool((sparse[..., [0, 1, 998]] == 0).all())  # zero rows: logit exactly 0
    assert layer.cpu_linear.rows_computed == (4, 1000)
    assert torch.equal(sparse.argmax(-1), dense.argmax(-1))


def test_not_installed_where_inexact_or_useless(monkeypatch):
    dense_rows = head(used=range(600))  # 40% zero rows: below MIN_ZERO_FRACTION
    assert not zr.maybe_install(dense_rows)
    with_bias = head()
    with_bias.bias = torch.nn.Parameter(torch.ones(1000), requires_grad=False)  # zero row -> logit 1, not 0
    assert not zr.maybe_install(with_bias)
    all_zero = head(used=())
    assert not zr.maybe_install(all_zero)
    no_cpu_dispatch = head()
    del no_cpu_dispatch.cpu_linear  # not vLLM's CPU GEMM path (GPU): left alone
    assert not zr.maybe_install(no_cpu_dispatch)
    monkeypatch.setenv(zr.ENV_SWITCH, "0")
    off = head()
    assert not zr.maybe_install(off)


def test_a_bias_at_call_time_is_refused():
    layer = head()
    assert zr.maybe_install(layer)
    with pytest.raises(RuntimeError, match="bias"):
        layer.cpu_linear(torch.randn(2, 32), layer.weight, torch.ones(1000))


def test_wraps_vllms_embedding_method_once():
    from vllm.model_executor.layers import vocab_parallel_embedding as vpe
    from vllm.v1.worker.worker_base import WorkerBase

    assert zr.install_zero_row_head()
    wrapped = vpe.UnquantizedEmbeddingMethod.process_weights_after_loading
    assert zr.install_zero_row_head()
    assert vpe.UnquantizedEmbeddingMethod.process_weights_after_loading is wrapped
    assert WorkerBase.specexit_head_rows is zr.head_rows
