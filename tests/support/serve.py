"""A Serve instance for a test module: local Ray in this process, Serve's HTTP proxy on a free
loopback port, the Serve app (serve_app.app:build_app) deployed under one or more names.

    @pytest.fixture(scope="module")
    def base():
        with running_serve(ServeApp("specexit", args)) as url:
            yield url
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from support.ports import free_port


@dataclass(frozen=True)
class ServeApp:
    name: str
    args: dict  # build_app's arguments: the `args:` block of a Serve config (serve_app/*.yaml)
    route_prefix: str = "/"


@contextmanager
def running_serve(*apps: ServeApp, timeout: float = 300, num_cpus: int = 8) -> Iterator[str]:
    """Start Ray + Serve, deploy `apps`, wait until every one is RUNNING, yield the base URL; shut Serve
    and Ray down afterwards. A deployment that fails raises at once with Serve's messages.

    RUNNING means the replicas started; an app may still need a first request to warm up, which is
    each test module's own readiness probe."""
    import ray
    from ray import serve

    from serve_app.app import build_app

    port = free_port()
    # "local": always a cluster of this module's own, never one a `ray start` elsewhere on the machine left
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for app in apps:
            serve.run(build_app(app.args), name=app.name, route_prefix=app.route_prefix, blocking=False)
        wait_running([app.name for app in apps], timeout)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def wait_running(names: list[str], timeout: float) -> None:
    from ray import serve

    t0 = time.time()
    while time.time() - t0 < timeout:
        st = serve.status().applications
        if all(st.get(a) and st[a].status == "RUNNING" for a in names):
            return
        if any(st.get(a) and st[a].status in ("DEPLOY_FAILED", "UNHEALTHY") for a in names):
            raise RuntimeError({a: st[a].message for a in st})
        time.sleep(2)
    raise TimeoutError(f"Serve apps {names} not running after {timeout:.0f}s")


def toy_model_args(model_id: str, **overrides) -> dict:
    """`applications[].args.model` of the shipped toy teacher + draft on CPU, float32, eager."""
    return {
        "id": model_id,
        "source": "toy:teacher",
        "draft": "toy:draft",
        "accelerator": "cpu",
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": 512,
        **overrides,
    }


def server_log_excerpt(needle: str, before: int = 5, after: int = 40, limit: int = 4000) -> str:
    """Lines around `needle` (e.g. a request id) in this process's Ray session logs (Serve's replica and
    proxy logs, the workers' stderr): the server side of a failed request, for a test's failure message."""
    import ray

    node = ray._private.worker._global_node
    if node is None or not needle:
        return ""
    out = []
    for path in sorted(Path(node.get_logs_dir_path()).rglob("*")):
        if not path.is_file() or path.suffix not in (".log", ".err", ".out"):
            continue
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if needle in line:
                out.append(f"== {path.name}:{i + 1}\n" + "\n".join(lines[max(0, i - before) : i + after]))
    return "\n".join(out)[-limit:]


def wait_generating(url: str, body: dict, headers: dict | None = None, timeout: float = 240) -> None:
    """Until one chat completion succeeds (/v1/models is answered by the ingress alone, before any
    engine replica is ready)."""
    import httpx

    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=60)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"no generation from the app at {url} within {timeout:g} s")
