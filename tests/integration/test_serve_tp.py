"""Tensor parallelism for real on CPU: a TP=2 engine replica (vLLM's CPU backend runs one rank per
process; each rank is bound to its own core) serves the toy model with the same greedy outputs and the
same SpecExit decisions as a TP=1 replica. Both apps run side by side in one Serve instance."""

import httpx
import pytest

from specexit_core.vllm_env import engine_cores_bind
from support.serve import ServeApp, running_serve, toy_model_args

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=5)]

PROMPTS = [
    "Compute from left to right : 7 + 5 * 3 - 4",
    "Compute from left to right : 12 - 3 + 8 * 2",
    "Compute from left to right : 9 * 9 - 17 + 4 - 30",
]


def args(tp: int, bind: str) -> dict:
    return {
        "model": toy_model_args(
            f"toy-tp{tp}",
            tensor_parallel_size=tp,
            max_num_seqs=8,
            seed=0,
            cpu={"kv_cache_gib": 1, "omp_threads_bind": bind},
        ),
        "request_timeout_s": 120,
    }


@pytest.fixture(scope="module")
def base():
    with running_serve(
        ServeApp("tp2", args(2, "0|1"), "/tp2"), ServeApp("tp1", args(1, engine_cores_bind()), "/tp1")
    ) as url:
        yield url


def _chat(url: str, tp: int, prompt: str, xargs: dict | None) -> dict:
    body = {
        "model": f"toy-tp{tp}",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 300,
        "temperature": 0,
        "stream_options": None,
    }
    if xargs:
        body["vllm_xargs"] = xargs
    r = httpx.post(f"{url}/tp{tp}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("xargs", [None, {"specexit_enabled": 0}], ids=["specexit-on", "specexit-off"])
def test_tp2_matches_tp1(base, xargs):
    for p in PROMPTS:
        a, b = _chat(base, 1, p, xargs), _chat(base, 2, p, xargs)
        ma, mb = a["choices"][0]["message"], b["choices"][0]["message"]
        assert (ma["reasoning"], ma["content"]) == (mb["reasoning"], mb["content"])
        sa, sb = a["usage"]["specexit"], b["usage"]["specexit"]
        assert {**sa, "signals": None} == {**sb, "signals": None}  # same exit, same place
        if sa["signals"]:  # smoothed signals agree up to float32 reduction order across ranks
            assert sa["signals"] == pytest.approx(sb["signals"], rel=1e-5)


def test_tp2_replica_runs_two_ranks(base):
    from ray import serve

    def procs(app: str) -> list[str]:
        h = serve.get_deployment_handle(f"SpecExitLLMServer:toy-{app}", app_name=app)
        return [name for _, name in h.specexit_engine_pids.remote().result(timeout_s=30)["named"]]

    tp1, tp2 = procs("tp1"), procs("tp2")
    workers = [n for n in tp2 if "Worker" in n or "TP" in n]
    print("tp1:", tp1, "tp2:", tp2)
    assert len(tp2) > len(tp1) and len(workers) >= 2, (tp1, tp2)
    # one rank on CPU: the engine core runs the model itself, no worker process (run_model_in_engine_core)
    assert any("EngineCore" in n for n in tp1) and not [n for n in tp1 if "Worker" in n], tp1
