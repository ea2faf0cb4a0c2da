"""A Ray cluster of several nodes on this one machine, and losing one of them (issue #43's drills).

The head (`ray start --head`, tests/support/ray_head.py) gets no CPUs of its own: the job drivers, the
job supervisor, Serve's controller and proxy and the 0-CPU Serve ingress run there, and everything that
asks for a CPU (Ray Data tasks, vLLM engine actors, training workers, engine replicas) goes to a worker
node. Each worker node is a `ray start --address HEAD` of its own (its own raylet, object store, ports,
agents and temp dir) with a custom resource `node_<name>: 1`, so a test can see what runs where.

A node is *lost* the way a preempted spot VM or an OOM-killed pod loses it: SIGKILL to its raylet and
every process under it (the core workers, the engine processes they forked, its dashboard and
runtime-env agents) at once, no drain, no graceful shutdown. The GCS marks it dead after its
health checks fail (`health_check_*` below: seconds here, 30 s by default).

    with multinode_cluster(nodes={"a": 2, "b": 2}) as c:
        c.submit(...)            # `ray job submit` to the head
        c.lose("b")              # SIGKILL node b; returns once the GCS has marked it dead
        c.add_node("c", 2)       # capacity returns
        c.restart_head()         # the head lost and restarted (the job table with it)
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from support.paths import VENV_BIN
from support.ports import free_ports
from support.ray_head import LocalHead, head_args, node_port_args

# The GCS declares a node dead after `failure_threshold` missed checks `period_ms` apart (Ray's
# defaults: 5 x 3 s after a 5 s grace, and a 10 s timeout each, ~30 s): a drill should not spend
# half a minute waiting for a death it caused itself.
HEALTH_CHECK = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 3,
}


@dataclass
class WorkerNode:
    name: str
    num_cpus: int
    manager_port: int
    node_id: str = ""
    alive: bool = True
    pids_killed: list[int] = field(default_factory=list)


class MultiNodeCluster(LocalHead):
    """A private Ray head with no CPUs plus worker nodes added and lost on demand."""

    def __init__(self, prefix: str = "raymn"):
        super().__init__(prefix)
        self.gcs_address = f"127.0.0.1:{self.gcs}"
        self.nodes: dict[str, WorkerNode] = {}

    def start(self) -> None:
        args = head_args(gcs=self.gcs, client=self.client, dash=self.dash, tmp=self.tmp, num_cpus=0)
        args += ["--system-config", json.dumps(HEALTH_CHECK)]
        subprocess.run([str(VENV_BIN / "ray"), *args], env=self.env, check=True, capture_output=True, timeout=120)

    def add_node(self, name: str, num_cpus: int) -> WorkerNode:
        """Start worker node `name` (`num_cpus` logical CPUs, resource `node_<name>: 1`); returns once the
        GCS lists it alive."""
        ports, port = node_port_args()
        args = [
            "start",
            "--address",
            self.gcs_address,
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            str(num_cpus),
            "--resources",
            json.dumps({f"node_{name}": 1}),
            *ports,
            "--object-store-memory",
            str(400 * 1024**2),
            "--disable-usage-stats",
            # a node's own temp dir, as on its own machine: nodes sharing one would share the runtime-env
            # agents' working_dir_files, and one agent's cleanup deletes the package a driver runs in
            "--temp-dir",
            f"{self.tmp}/{name}",
        ]
        subprocess.run([str(VENV_BIN / "ray"), *args], env=self.env, check=True, capture_output=True, timeout=120)
        node = WorkerNode(name, num_cpus, port)
        self.nodes[name] = node
        node.node_id = self._wait_node(lambda n: n["resources_total"].get(f"node_{name}") and n["state"] == "ALIVE")
        return node

    def lose(self, name: str, timeout: float = 60) -> float:
        """SIGKILL node `name`'s raylet and every process under it at once; return the seconds until the
        GCS marked it dead."""
        node = self.nodes[name]
        raylet = [p for p in self._procs() if f"--node_manager_port={node.manager_port}" in _cmdline(p)]
        assert len(raylet) == 1, f"no single raylet for node {name}: {raylet}"
        victims = [raylet[0], *raylet[0].children(recursive=True)]
        t0 = time.time()
        _sigkill(victims)
        node.pids_killed = [p.pid for p in victims]
        node.alive = False
        self._wait_node(lambda n: n["node_id"] == node.node_id and n["state"] == "DEAD", timeout)
        return time.time() - t0

    def restart_head(self) -> None:
        """The head is lost and a new one starts in its place, as a head pod restarts without GCS fault
        tolerance: SIGKILL to every process of the cluster (the worker nodes' too: without their GCS they
        stop serving and exit after Ray's reconnect timeout anyway), then a fresh head on new ports with
        the same temp root. Worker nodes join again with `add_node`."""
        import psutil

        procs = self._procs()
        _sigkill(procs)
        psutil.wait_procs(procs, timeout=15)
        for n in self.nodes.values():
            n.alive = False
        self.gcs, self.dash, self.client = free_ports(3)
        self.address, self.gcs_address = f"http://127.0.0.1:{self.dash}", f"127.0.0.1:{self.gcs}"
        self.start()

    def node_of_pid(self, pid: int) -> str | None:
        """The worker node whose raylet runs process `pid` (None: the head, or no such process)."""
        import psutil

        try:
            chain = [psutil.Process(pid), *psutil.Process(pid).parents()]
        except psutil.NoSuchProcess:
            return None
        cmdlines = [_cmdline(p) for p in chain]
        return next(
            (n.name for n in self.nodes.values() for c in cmdlines if f"--node_manager_port={n.manager_port}" in c),
            None,
        )

    def actor_nodes(self, title: str) -> Counter:
        """Worker node name -> created actors on it whose process title starts with `title`, read from this
        machine's process table: a Ray actor's process is titled `ray::<class>.__init__` until it is
        created, then `ray::<class>[.<method>]`. (The state API answers the same through a dashboard round
        trip per call: polled every 0.1 s during the traces and labels drills, ~70 CPU-s of the dashboard's
        and the test process's; docs/results/test_profile_after_e0916ed.json `node_loss_watch_ab`.)"""
        import psutil

        up = Counter()
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if cmd.startswith(title) and ".__init__" not in cmd:
                node = self.node_of_pid(p.info["pid"])
                if node:
                    up[node] += 1
        return up

    def node_of(self, node_id: str) -> str | None:
        """The name of the worker node with Ray node id `node_id` (None: the head)."""
        return next((n.name for n in self.nodes.values() if n.node_id == node_id), None)

    def _wait_node(self, match, timeout: float = 60) -> str:
        from ray.util.state import list_nodes

        t0 = time.time()
        while time.time() - t0 < timeout:
            for n in list_nodes(address=self.address, detail=True, raise_on_missing_output=False):
                n = n if isinstance(n, dict) else n.__dict__
                if match(n):
                    return n["node_id"]
            time.sleep(0.5)
        raise TimeoutError("no node matched within the timeout")


def _sigkill(procs) -> None:
    """SIGKILL every process at once (no drain, no graceful shutdown), skipping those already gone."""
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _cmdline(p) -> str:
    """A process's command line, "" once it has exited (workers come and go while a node is searched)."""
    import psutil

    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


@contextmanager
def multinode_cluster(nodes: dict[str, int]) -> Iterator[MultiNodeCluster]:
    """A head and one worker node per `nodes` entry (name -> CPUs); everything stopped afterwards."""
    c = MultiNodeCluster()
    c.start()
    try:
        for name, cpus in nodes.items():
            c.add_node(name, cpus)
        yield c
    finally:
        c.stop()
