"""`ray start --head` arguments for a private test cluster: every port its own.

Ray's defaults fix some ports (dashboard agent 52365, metrics export, runtime-env agent): with
another Ray instance on the machine (an in-process `ray.init()` of an earlier test, another
engineer's job) the second head's job agent cannot bind, and `ray job submit` fails with "No
available agent to submit job". Free ports for all of them keep test clusters independent.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable

from support.paths import REPO_ROOT, VENV_BIN
from support.ports import free_ports


def node_port_args() -> tuple[list[str], int]:
    """A node's own ports (agents, metrics, node and object managers) as `ray start` flags, every one
    distinct and free, and the node manager's port (it names the node's raylet)."""
    agent, agent_grpc, env_agent, metrics, manager, objects = free_ports(6)
    ports = {
        "--dashboard-agent-listen-port": agent,
        "--dashboard-agent-grpc-port": agent_grpc,
        "--runtime-env-agent-port": env_agent,
        "--metrics-export-port": metrics,
        "--node-manager-port": manager,
        "--object-manager-port": objects,
    }
    return [x for flag, port in ports.items() for x in (flag, str(port))], manager


def head_args(*, gcs: int, client: int, dash: int, tmp: str, num_cpus: int = 8) -> list[str]:
    return [
        "start",
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(gcs),
        "--ray-client-server-port",
        str(client),
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dash),
        *node_port_args()[0],
        "--num-cpus",
        str(num_cpus),
        "--object-store-memory",
        str(800 * 1024**2),
        "--include-dashboard",
        "true",
        "--disable-usage-stats",
        "--temp-dir",
        tmp,
    ]


class LocalHead:
    """A private Ray head: own ports and temp dir; stopped by PID (never `ray stop`, which would
    also stop every other Ray cluster on the machine)."""

    def __init__(self, prefix: str = "rayt"):
        self.tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: Ray's socket paths are length-limited
        self.gcs, self.dash, self.client = free_ports(3)
        self.address = f"http://127.0.0.1:{self.dash}"
        self.env = dict(
            os.environ,
            PATH=f"{VENV_BIN}:{os.environ['PATH']}",
            RAY_AUTH_MODE="disabled",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        self.env.pop("RAY_ADDRESS", None)

    def start(self) -> None:
        args = head_args(gcs=self.gcs, client=self.client, dash=self.dash, tmp=self.tmp)
        subprocess.run([str(VENV_BIN / "ray"), *args], env=self.env, check=True, capture_output=True, timeout=120)

    def ray(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """The venv's `ray` CLI (`ray job submit ...`) with this head's environment, in the checkout."""
        return subprocess.run(
            [str(VENV_BIN / "ray"), *args], env=self.env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT
        )

    # Waiting on a job polls the dashboard's job API in this process (Ray's JobSubmissionClient): the
    # `ray job status` CLI was a Python process importing Ray every 2 s (~1.3 CPU-s each, #38).
    def jobs(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address)

    def logs(self, job_id: str) -> str:
        return self.jobs().get_job_logs(job_id)

    def wait(self, job_id: str, timeout: float = 600) -> str:
        """The job's final status (SUCCEEDED, FAILED or STOPPED)."""
        client, t0 = self.jobs(), time.time()
        while time.time() - t0 < timeout:
            s = str(client.get_job_status(job_id))
            if s in ("SUCCEEDED", "FAILED", "STOPPED"):
                return s
            time.sleep(1)
        raise TimeoutError(job_id)

    def _procs(self):
        import psutil

        mine = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                # the temp dir names most of them; the client server only names the GCS port
                if any(self.tmp in a or a.endswith(f":{self.gcs}") for a in (p.info["cmdline"] or [])):
                    mine.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        kids = []
        for p in mine:
            try:
                kids += p.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        return list({p.pid: p for p in mine + kids}.values())

    def stop(self) -> None:
        stop_processes(self._procs(), timeout=8)
        shutil.rmtree(self.tmp, ignore_errors=True)


def stop_processes(procs, timeout: float) -> None:
    """SIGTERM each psutil process, then SIGKILL what is still alive after `timeout` seconds."""
    import psutil

    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def retry_no_agent(
    submit: Callable[[], subprocess.CompletedProcess], tries: int = 12, pause_s: float = 5
) -> subprocess.CompletedProcess:
    """Run a `ray job submit` call until the head's job agent took it.

    A fresh head's job agent registers a few seconds after `ray start` returns; under load that
    exceeds the job head's fixed 10 s wait and the submit fails with "No available agent" without
    creating the job, so it is safe to submit again."""
    for _ in range(tries):
        r = submit()
        if r.returncode == 0 or "No available agent" not in r.stdout + r.stderr:
            return r
        time.sleep(pause_s)
    return r
