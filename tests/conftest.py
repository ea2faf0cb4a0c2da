import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401

        return True
    except Exception:
        return False


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    skip_vllm = pytest.mark.skip(reason="vLLM is not installed (run scripts/setup.sh)")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    has_vllm, has_cuda = _has_vllm(), _has_cuda()
    for item in items:
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(skip_vllm)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def teacher():
    """The shipped toy teacher, loaded once (transformers, float32)."""
    from specexit_core.toy.hf_generate import load_teacher
    from specexit_core.toy.paths import TEACHER_DIR

    return load_teacher(TEACHER_DIR)
