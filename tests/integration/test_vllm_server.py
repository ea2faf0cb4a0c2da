"""SpecExit through vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from specexit_core.toy.task import grade, problems
from specexit_core.vllm_env import engine_cores_bind
from support.ports import free_port

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    prom = tmp_path_factory.mktemp("prom")  # multiprocess metrics: worker counters reach /metrics
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND=engine_cores_bind(),
        PROMETHEUS_MULTIPROC_DIR=str(prom),
    )
    spec = json.dumps({"method": "eagle3", "model": str(DRAFT_DIR), "num_speculative_tokens": 3})
    log = open(tmp_path_factory.mktemp("server") / "server.log", "w")  # noqa: SIM115 (the server writes it until teardown)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(TEACHER_DIR),
            "--served-model-name",
            "specexit-toy",
            "--speculative-config",
            spec,
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "512",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {Path(log.name).read_text()[-3000:]}")
            try:
                if requests.get(base + "/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(1)
        else:
            raise RuntimeError("server did not become healthy")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def chat(base, content, **extra):
    return requests.post(
        base + "/v1/chat/completions",
        timeout=120,
        json={
            "model": "specexit-toy",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 400,
            "temperature": 0,
            **extra,
        },
    )


def test_openai_client_with_and_without_exit(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="unused")
    p = problems("test", 1, seed=99)[0]
    on = client.chat.completions.create(
        model="specexit-toy", messages=[{"role": "user", "content": p.prompt}], max_tokens=400, temperature=0
    )
    off = client.chat.completions.create(
        model="specexit-toy",
        messages=[{"role": "user", "content": p.prompt}],
        max_tokens=400,
        temperature=0,
        extra_body={"vllm_xargs": {"specexit_enabled": 0}},
    )
    forced = client.chat.completions.create(
        model="specexit-toy",
        messages=[{"role": "user", "content": p.prompt}],
        max_tokens=400,
        temperature=0,
        extra_body={"vllm_xargs": {"specexit_method": "progress", "specexit_progress_threshold": 0.0}},
    )
    t_on, t_off, t_forced = (r.choices[0].message.content for r in (on, off, forced))
    assert "</think>" in t_off and grade(t_off, p.answer)
    assert len(t_on) <= len(t_off)
    # progress > 0 passes at the first paragraph break: exactly one paragraph of thought
    assert t_forced.split("</think>")[0].count("\n\n") == 1


@pytest.mark.parametrize(
    "xargs,needle",
    [
        ({"specexit_confidence_threshold": 3}, "confidence_threshold"),
        ({"specexit_nope": 1}, "unknown SpecExit control"),
        ({"specexit_enabled": "perhaps"}, "boolean"),
    ],
)
def test_invalid_controls_get_400_and_server_keeps_serving(server, xargs, needle):
    r = chat(server, "Compute from left to right : 1 + 2", vllm_xargs=xargs)
    assert r.status_code == 400, r.text
    assert needle in r.text
    assert chat(server, "Compute from left to right : 1 + 2").status_code == 200


def test_specexit_counters_in_vllm_metrics(server):
    """After the forced-exit request above, /metrics shows SpecExit's counters next to vLLM's."""
    r = chat(
        server,
        "Compute from left to right : 3 + 4 * 2",
        vllm_xargs={"specexit_method": "progress", "specexit_progress_threshold": 0.0},
    )
    assert r.status_code == 200
    chat(server, "Compute from left to right : 1 + 1")  # one more step so finished requests are counted
    text = requests.get(server + "/metrics", timeout=10).text
    exits = [line for line in text.splitlines() if line.startswith("specexit_exits_total")]
    assert exits and sum(float(line.split()[-1]) for line in exits) >= 1, exits
    assert "specexit_requests_total" in text and "vllm:spec_decode_num_drafts" in text
