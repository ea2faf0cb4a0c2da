"""Autoscaling for real: under load above `target_ongoing_requests` Serve starts a second vLLM engine
replica, requests keep succeeding while it starts, and it goes away again when the load stops."""

import asyncio
import threading
import time

import httpx
import pytest

from support.serve import ServeApp, running_serve, toy_model_args

pytestmark = pytest.mark.vllm

MODEL = "toy-auto"
SERVER = f"SpecExitLLMServer:{MODEL}"


@pytest.fixture(scope="module")
def base():
    with running_serve(
        ServeApp(
            "auto",
            {
                "model": toy_model_args(MODEL, max_num_seqs=16),
                "autoscaling": {
                    "min_replicas": 1,
                    "max_replicas": 2,
                    "target_ongoing_requests": 1,
                    "upscale_delay_s": 0,
                    "downscale_delay_s": 5,
                },
                "backpressure": {"max_ongoing_requests": 8, "max_queued_requests": 64},
                "request_timeout_s": 120,
            },
        )
    ) as url:
        yield url


def running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get("auto")
    dep = app.deployments.get(SERVER) if app else None
    return dep.replica_states.get("RUNNING", 0) if dep else 0


def test_scales_up_under_load_and_back_down(base):
    t0 = time.time()
    while running_replicas() < 1:
        assert time.time() - t0 < 240, "first replica never started"
        time.sleep(1)
    stop, codes = threading.Event(), []

    async def load():
        async with httpx.AsyncClient(base_url=base, timeout=120) as c:

            async def worker():
                while not stop.is_set():
                    r = await c.post(
                        "/v1/chat/completions",
                        json={
                            "model": MODEL,
                            "messages": [{"role": "user", "content": "Compute from left to right : 7 + 5"}],
                            "max_tokens": 300,
                            "temperature": 0,
                            "ignore_eos": True,
                        },
                    )
                    codes.append(r.status_code)

            await asyncio.gather(*(worker() for _ in range(6)))

    th = threading.Thread(target=lambda: asyncio.run(load()))
    th.start()
    try:
        t1 = time.time()
        while running_replicas() < 2:
            assert time.time() - t1 < 240, "no second replica under load"
            time.sleep(1)
        scaled_after = time.time() - t1
        n_before = len(codes)
        time.sleep(3)  # both replicas serve
    finally:
        stop.set()
        th.join(150)
    assert codes and set(codes) == {200}, {c: codes.count(c) for c in set(codes)}
    assert len(codes) > n_before
    t2 = time.time()
    while running_replicas() > 1:
        assert time.time() - t2 < 120, "did not scale back down"
        time.sleep(1)
    print(f"scaled up after {scaled_after:.0f}s of load, {len(codes)} requests, back to 1 in {time.time() - t2:.0f}s")
