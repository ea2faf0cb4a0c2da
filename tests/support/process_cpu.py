"""CPU seconds by kind of process over a command's run: where the suite's work goes, not only its time.

    python tests/support/process_cpu.py record OUT.json -- bash .ci/run
    python tests/support/process_cpu.py summarise OUT.json [SUMMARY.json]

`record` runs the command while polling /proc every 0.25 s: for each process (pid + start time) the CPU
time it used while seen (user + system; for one that existed before the command, only what it used
during it) and every command line it had (Ray renames its workers `ray::IDLE`, then `ray::<actor or
task>`). A process that lives less than a poll is missed, so the total is a lower bound; the poller
itself costs ~1.5% of a core. `summarise` groups the processes into kinds (`KINDS`, first match wins)
and prints CPU-s and process counts per kind; the suite's profiles keep it as `cpu_by_process`.
Linux only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

POLL_S = 0.25
RAY_NAME = re.compile(r"ray::(\S+)")


def _snapshot(seen: dict, hz: int, pre: bool) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
        except OSError:
            continue
        close = stat.rindex(")")
        fields = stat[close + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / hz
        cmd = cmd.strip() or stat[stat.index("(") + 1 : close]
        key = f"{pid}:{fields[19]}"  # the pid and its start time: a reused pid is another process
        p = seen.get(key)
        if p is None:
            seen[key] = {"first": cpu if pre else 0.0, "cpu": cpu, "cmds": [cmd]}
        else:
            p["cpu"] = cpu
            if cmd != p["cmds"][-1]:
                p["cmds"].append(cmd)


def record(out: Path, argv: list[str]) -> int:
    """Run `argv`, polling /proc until it exits; write every process seen to `out`; its exit status."""
    hz, seen, stop = os.sysconf("SC_CLK_TCK"), {}, threading.Event()
    _snapshot(seen, hz, pre=True)

    def poll() -> None:
        while not stop.is_set():
            _snapshot(seen, hz, pre=False)
            time.sleep(POLL_S)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    t0 = time.time()
    proc = subprocess.Popen(argv)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    stop.set()
    t.join()
    procs = [{"cpu_s": round(p["cpu"] - p["first"], 2), "cmds": p["cmds"]} for p in seen.values()]
    out.write_text(json.dumps({"command": argv, "wall_s": round(time.time() - t0, 1), "processes": procs}))
    return rc


def _ray_names(cmds: list[str]) -> list[str]:
    return [m.group(1) for c in cmds for m in RAY_NAME.finditer(c)]


def _any(names: list[str], *parts: str) -> bool:
    return any(p in n for n in names for p in parts)


# (kind, test on (all command lines joined, Ray names)): the first that matches names the process
KINDS = [
    ("vLLM worker processes, tensor parallel", lambda c, n: "Worker_TP" in c),
    ("vLLM worker process (mp executor)", lambda c, n: "VLLM::Worker" in c),
    ("vLLM engine-core process", lambda c, n: "EngineCor" in c),
    ("vLLM model-info subprocess", lambda c, n: "vllm.model_executor.models.registry" in c),
    ("pytest processes (the tests, models run in them)", lambda c, n: "pytest" in c),
    ("Ray Data footer readers", lambda c, n: _any(n, "FooterReader")),
    (
        "Ray Data engine actors (traces, labels, evaluation)",
        lambda c, n: _any(n, "EvalWorker", "ProbeLabeler", "vLLMEngineStageUDF"),
    ),
    (
        "Ray Train workers and controller",
        lambda c, n: (
            _any(n, "RayTrainWorker", "TrainController", "SynchronizationActor", "PreemptionWatcher")
            or _any(n, "PlacementGroupCleaner", "DatasetManager", "SplitCoordinator")
        ),
    ),
    ("Serve replicas, controller, proxy", lambda c, n: _any(n, "SERVE")),
    (
        "other Ray Data actors and tasks",
        lambda c, n: (
            _any(n, "_StatsActor", "AutoscalingCoordinator", "ActorLocationTracker", "ReadText", "Map(")
            or _any(n, "ListFiles", "ReadFiles", "MapBatches", "Write", "Project", "split")
        ),
    ),
    ("Ray workers that never ran anything", lambda c, n: bool(n) and set(n) == {"IDLE"}),
    (
        "Ray system (gcs, raylet, dashboard and its agents, log monitor)",
        lambda c, n: (
            any(k in c for k in ("gcs_server", "/raylet ", "dashboard", "log_monitor", "monitor.py", "forkserver"))
            or _any(n, "DashboardAgent", "RuntimeEnvAgent", "JobSupervisor", "TelemetryAgent", "client.server")
        ),
    ),
    ("`ray job status` CLI", lambda c, n: "ray job status" in c),
    ("other `ray` CLI (`ray job submit`, `ray start`)", lambda c, n: "/bin/ray " in c),
    ("specexit CLIs and job drivers", lambda c, n: "specexit_app.cli" in c or "pipelines." in c or "specexit " in c),
    ("setup (pip, npm)", lambda c, n: "pip" in c or "npm" in c),
]
OTHER = "other (kernel threads, shells, tools)"


def kind(cmds: list[str]) -> str:
    joined, names = " | ".join(cmds), _ray_names(cmds)
    return next((k for k, test in KINDS if test(joined, names)), OTHER)


def summarise(doc: dict) -> dict:
    """{"total_cpu_s", "processes", "by_kind": {kind: {"cpu_s", "processes"}}}, largest first."""
    by: dict = defaultdict(lambda: [0, 0.0])
    for p in doc["processes"]:
        k = kind(p["cmds"])
        by[k][0] += 1
        by[k][1] += p["cpu_s"]
    rows = sorted(by.items(), key=lambda kv: -kv[1][1])
    return {
        "total_cpu_s": round(sum(c for _, (_, c) in rows), 1),
        "processes": sum(n for _, (n, _) in rows),
        "by_kind": {k: {"cpu_s": round(c, 1), "processes": n} for k, (n, c) in rows},
    }


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "record" and argv[2] == "--":
        return record(Path(argv[1]), argv[3:])
    if len(argv) in (2, 3) and argv[0] == "summarise":
        s = summarise(json.loads(Path(argv[1]).read_text()))
        print(f"{s['total_cpu_s']:9.1f} CPU-s  {s['processes']:5d} processes  total")
        for k, v in s["by_kind"].items():
            print(f"{v['cpu_s']:9.1f} CPU-s  {v['processes']:5d} processes  {k}")
        if len(argv) == 3:
            Path(argv[2]).write_text(json.dumps(s, indent=1) + "\n")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
