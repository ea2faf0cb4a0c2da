"""specexit_core.vllm_env's process-layout rule for the async engine (Serve replicas, the benches'
direct path): the engine core runs the model itself on CPU at one rank, and only there."""

from types import SimpleNamespace

import pytest

from specexit_core.vllm_env import run_model_in_engine_core


def _cfg(device: str, world_size: int, backend: str) -> SimpleNamespace:
    return SimpleNamespace(
        device_config=SimpleNamespace(device_type=device),
        parallel_config=SimpleNamespace(world_size=world_size, distributed_executor_backend=backend),
    )


def test_cpu_one_rank_mp_becomes_uniprocess():
    cfg = _cfg("cpu", 1, "mp")
    assert run_model_in_engine_core(cfg) is True
    assert cfg.parallel_config.distributed_executor_backend == "uni"


@pytest.mark.parametrize(
    "device,world_size,backend",
    [("cuda", 1, "mp"), ("cuda", 1, "ray"), ("cpu", 2, "mp"), ("cpu", 1, "ray"), ("cpu", 1, "uni")],
)
def test_everything_else_is_left_as_it_is(device, world_size, backend):
    cfg = _cfg(device, world_size, backend)
    assert run_model_in_engine_core(cfg) is False
    assert cfg.parallel_config.distributed_executor_backend == backend
