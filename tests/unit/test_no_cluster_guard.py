"""tests/unit/conftest.py refuses Ray clusters and vLLM engines inside unit tests."""

import pytest


def test_ray_init_fails_the_test():
    import ray

    with pytest.raises(pytest.fail.Exception, match="tests/integration"):
        ray.init(num_cpus=1)
    assert not ray.is_initialized()


def test_vllm_engine_construction_fails_the_test():
    from vllm.v1.engine.async_llm import AsyncLLM  # already imported by the Serve unit tests

    with pytest.raises(pytest.fail.Exception, match=r"vLLM engine \(AsyncLLM\)"):
        AsyncLLM(vllm_config=None, executor_class=None, log_stats=False)
