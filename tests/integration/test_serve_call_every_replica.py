"""`call_every_replica` (serve_app/ray_llm.py) on a real Serve deployment behind the prefix router:
every running replica answers, once each, every time, and a replica that does not answer within the
deadline is an error, not a wait. (It used a handle once: Ray 2.60's `broadcast` built the handle's
custom request router in the caller's thread, "no running event loop"; a routed call first cured
that, and then waited forever once in CI with every replica alive.)"""

import os
import time

import pytest
import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from serve_app.ray_llm import call_every_replica
from serve_app.routing import ROUTER_PATH

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=0.3)]


@serve.deployment(
    num_replicas=2,
    ray_actor_options={"num_cpus": 0},
    request_router_config=RequestRouterConfig(request_router_class=ROUTER_PATH),
)
class Pid:
    def pid(self) -> int:
        return os.getpid()

    def slow(self) -> None:
        time.sleep(3)


@pytest.fixture(scope="module")
def app():
    ray.init(num_cpus=1, include_dashboard=False)
    try:
        serve.run(Pid.bind(), name="every-replica", route_prefix=None)
        yield "every-replica"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_every_replica_answers_once_through_a_fresh_handle_each_time(app):
    answers = [call_every_replica("Pid", app, "pid") for _ in range(3)]
    for pids in answers:
        assert len(pids) == 2 and len(set(pids)) == 2, pids
    assert {frozenset(p) for p in answers} == {frozenset(answers[0])}


def test_a_replica_past_the_deadline_is_an_error(app):
    with pytest.raises(ray.exceptions.GetTimeoutError):
        call_every_replica("Pid", app, "slow", timeout_s=0.5)
