"""A stage's CPU engine actors leave a CPU for the tasks that read their input (pipelines/common/runtime.py):
with every CPU held by an engine, Ray Data's read never runs and the job waits forever. The node-loss drill's
head restart resubmits a labels job of two engines onto one 2-CPU node, end to end."""

from pipelines.common.runtime import engines_that_fit


def test_the_engines_leave_one_cpu_for_the_input_tasks():
    assert engines_that_fit(2, 2) == 1  # a job resubmitted onto the one 2-CPU node a node loss left
    assert engines_that_fit(2, 3) == 2
    assert engines_that_fit(2, 4.0) == 2  # as asked when they fit
    assert engines_that_fit(8, 8) == 7


def test_at_least_one_engine():
    assert engines_that_fit(1, 1) == 1
    assert engines_that_fit(3, 0) == 1  # no CPU listed yet: one engine, Ray waits for the capacity
