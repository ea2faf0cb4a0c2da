"""`ray start --head` arguments for a private test cluster: every port its own.

Ray's defaults fix some ports (dashboard agent 52365, metrics export, runtime-env agent): with
another Ray instance on the machine (an in-process `ray.init()` of an earlier test, another
engineer's job) the second head's job agent cannot bind, and `ray job submit` fails with "No
available agent to submit job". Free ports for all of them keep test clusters independent.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def head_args(*, gcs: int, client: int, dash: int, tmp: str, num_cpus: int = 8) -> list[str]:
    return ["start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
            "--ray-client-server-port", str(client), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
            "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
            "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--num-cpus", str(num_cpus), "--object-store-memory", str(800 * 1024**2), "--include-dashboard", "true",
            "--disable-usage-stats", "--temp-dir", tmp]
