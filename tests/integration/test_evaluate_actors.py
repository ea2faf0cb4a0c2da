"""The evaluation's actor pool on a real local Ray cluster: every engine actor gets its share of the
batches (Ray Data's defaults gave a whole block of batches to the first actor to start while the
other sat idle), and each actor claims its own core set of the binding."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import pytest


class _SlowStart:
    """Stands in for EvalWorker: one of the two starts late, as a second vLLM engine does."""

    def __init__(self, *, lock_dir: str, late_s: float):
        from specexit_core.vllm_env import claim_core_set

        self.bind, self._hold = claim_core_set("0-1", 2, lock_dir=lock_dir)
        if self.bind == "1":
            time.sleep(late_s)

    def __call__(self, batch):
        time.sleep(6.0)  # a batch takes longer than the late actor's start
        n = batch.num_rows
        import pyarrow as pa

        return pa.table({"id": batch.column("id"), "pid": [os.getpid()] * n, "bind": [self.bind] * n})


@pytest.fixture(scope="module")
def ray_local():
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import this test module
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_each_actor_gets_batches_and_its_own_cores(ray_local, tmp_path):
    from pipelines.evaluate.job import map_over_actors, spread_timed

    rows = spread_timed([{"id": i, "timed": i < 2} for i in range(40)])  # as calibration: 40 problems, 2 actors
    ds = map_over_actors(rows, _SlowStart, {"lock_dir": str(tmp_path), "late_s": 3.0}, actors=2, batch=20, num_cpus=1)
    out = ds.take_all()
    assert sorted(r["id"] for r in out) == list(range(40))  # every row once
    per_actor = Counter((r["pid"], r["bind"]) for r in out)
    assert len(per_actor) == 2, per_actor  # both actors worked
    assert sorted(b for _, b in per_actor) == ["0", "1"]  # on different cores
    assert sorted(per_actor.values()) == [20, 20], per_actor  # a batch of 20 each
