"""Unit tests run without a Ray cluster and without a vLLM engine (that is what makes them unit tests:
seconds, any machine). Starting either inside a unit test fails the test at once, naming the call.

Guarded: `ray.init` (also reached by Serve/Data/Train auto-init) and the vLLM engine classes (`vllm.LLM`,
`AsyncLLM` / `AsyncLLMEngine`, `LLMEngine`, `EngineCore`). Importing ray or vllm is fine. The guard
is undone after each test, so a session that also runs tests/integration is unaffected. Modules
imported for the first time during a test are guarded as they load (an import hook), so the guard does
not import vLLM's heavy modules itself.
"""

from __future__ import annotations

import functools
import sys

import pytest

from support.profile_hooks.after_import import AfterImport

MOVE = "fake it, or move the test to tests/integration/"

# Guarded once a module has loaded: module -> [(module holding it, attribute path, what it starts)].
# `ray.init` is a function re-exported by ray/__init__ from ray._private.worker: both names are
# replaced once `ray` has loaded (replacing the inner one earlier would be re-exported as the original).
GUARDED = {
    "ray": [("ray", "init", "a Ray cluster (ray.init)"), ("ray._private.worker", "init", "a Ray cluster (ray.init)")],
    "vllm.entrypoints.llm": [("vllm.entrypoints.llm", "LLM.__init__", "a vLLM engine (vllm.LLM)")],
    "vllm.v1.engine.async_llm": [("vllm.v1.engine.async_llm", "AsyncLLM.__init__", "a vLLM engine (AsyncLLM)")],
    "vllm.v1.engine.llm_engine": [("vllm.v1.engine.llm_engine", "LLMEngine.__init__", "a vLLM engine (LLMEngine)")],
    "vllm.v1.engine.core": [("vllm.v1.engine.core", "EngineCore.__init__", "a vLLM engine core (EngineCore)")],
}


def _refuse(what: str):
    def refused(*args, **kwargs):
        pytest.fail(
            f"a unit test started {what}: tests/unit runs without Ray clusters and vLLM engines; {MOVE}", pytrace=True
        )

    return refused


def _guard_module(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for holder, path, what in GUARDED[name]:
        *owners, attr = path.split(".")
        target = functools.reduce(getattr, owners, sys.modules[holder])
        monkeypatch.setattr(target, attr, _refuse(what))


@pytest.fixture(autouse=True)
def no_ray_cluster_no_vllm_engine(monkeypatch):
    for name in GUARDED:
        if name in sys.modules:
            _guard_module(name, monkeypatch)
    hook = AfterImport(GUARDED, lambda module: _guard_module(module.__name__, monkeypatch))  # first loads too
    sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        sys.meta_path.remove(hook)
    # monkeypatch restores every guarded attribute after this fixture


@pytest.fixture
def one_torch_thread():
    """Tiny matmuls on a shared 2-core machine: threads only contend (modules opt in with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
