"""Where the suite's time goes: a pytest plugin, on when SPECEXIT_TEST_PROFILE is set.

    SPECEXIT_TEST_PROFILE=1 bash scripts/test.sh            -> runs/test-profile/profile.json
    SPECEXIT_TEST_PROFILE=DIR bash scripts/test.sh tests/x  -> DIR/profile.json

Every pytest process (the xdist workers and the controller of each pass of scripts/test.sh) appends its
tests' phases (setup / call / teardown, start and stop) and its slow fixture setups to DIR/timeline/;
every process the tests start appends what it started (Ray clusters, vLLM engines, Serve applications:
profile_hooks/sitecustomize.py) to DIR/events/. At the end of each pass the controller rebuilds
DIR/profile.json from all of it: seconds per module and per fixture setup, and each start counted, timed
and charged to the test module that was running on that worker when it began. scripts/test.sh clears
DIR before the first pass, so the file covers one whole run.
"""

from __future__ import annotations

import bisect
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

HOOKS_DIR = Path(__file__).resolve().parent / "profile_hooks"
REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_MIN_S = 1.0  # fixture setups shorter than this are not listed one by one
KINDS = ("ray_cluster", "vllm_engine", "vllm_engine_core", "serve_app")


def profile_dir() -> Path | None:
    """The profile folder SPECEXIT_TEST_PROFILE names ("1": runs/test-profile), or None when off."""
    value = os.environ.get("SPECEXIT_TEST_PROFILE", "")
    if value in ("", "0"):
        return None
    return (REPO_ROOT / "runs" / "test-profile") if value == "1" else Path(value).resolve()


def enable() -> None:
    """Called by tests/conftest.py before anything imports Ray or vLLM: every process started from here on
    (and this one) records its starts."""
    d = profile_dir()
    if d is None:
        return
    os.environ["SPECEXIT_TEST_PROFILE_DIR"] = str(d)
    path = os.environ.get("PYTHONPATH", "")
    if str(HOOKS_DIR) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOKS_DIR), path) if p)
    sys.path.insert(0, str(HOOKS_DIR))
    import sitecustomize  # noqa: F401  (this folder's; installs the hooks in this process too)

    sys.modules["sitecustomize"].install()


class SuiteProfile:
    """The plugin object (registered by tests/conftest.py's pytest_configure when profiling)."""

    def __init__(self, d: Path, is_controller: bool):
        from sitecustomize import worker_key  # profile_hooks/, loaded by enable() before this plugin exists

        self.worker = worker_key()
        self.dir = d
        self.is_controller = is_controller
        self.t0 = time.time()
        (d / "timeline").mkdir(parents=True, exist_ok=True)
        self.file = d / "timeline" / f"{self.worker.replace(':', '-')}-{os.getpid()}.jsonl"

    def _write(self, row: dict) -> None:
        with open(self.file, "a") as f:
            f.write(json.dumps(row) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        t0 = time.time()
        yield
        t1 = time.time()
        if t1 - t0 >= FIXTURE_MIN_S:
            self._write(
                {
                    "fixture": fixturedef.argname,
                    "scope": fixturedef.scope,
                    "module": request.node.nodeid.split("::")[0],
                    "start": round(t0, 3),
                    "stop": round(t1, 3),
                    "worker": self.worker,
                }
            )

    def pytest_runtest_logreport(self, report):
        if os.environ.get("PYTEST_XDIST_WORKER") is None and getattr(report, "node", None) is not None:
            return  # the xdist controller's copy of a worker's report: the worker wrote it
        self._write(
            {
                "test": report.nodeid,
                "phase": report.when,
                "outcome": report.outcome,
                "start": round(report.start, 3),
                "stop": round(report.stop, 3),
                "worker": self.worker,
            }
        )

    def pytest_sessionfinish(self, session):
        if not self.is_controller:
            return
        passes_file = self.dir / "passes.jsonl"
        with open(passes_file, "a") as f:
            f.write(
                json.dumps(
                    {
                        "pass": os.environ.get("SPECEXIT_TEST_PASS", "pytest"),
                        "args": session.config.invocation_params.args,
                        "start": round(self.t0, 3),
                        "stop": round(time.time(), 3),
                        "wall_s": round(time.time() - self.t0, 1),
                        "exit": int(session.exitstatus),
                    }
                )
                + "\n"
            )
        out = build_profile(self.dir)
        (self.dir / "profile.json").write_text(json.dumps(out, indent=1) + "\n")


def _jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file, or of every such file in a folder; none when it does not exist."""
    rows = []
    for p in sorted(path.glob("*.jsonl")) if path.is_dir() else [path] if path.exists() else []:
        for line in p.read_text().splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass  # a line cut short by a killed process
    return rows


def machine() -> dict:
    """The machine the run was on: CPU model, cores, AVX-512 or not (CI's two machine kinds differ)."""
    model, flags = platform.processor(), ""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((x.split(":", 1)[1].strip() for x in info if x.startswith("model name")), model)
        flags = next((x for x in info if x.startswith("flags")), "")
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "host": socket.gethostname(),
    }


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=REPO_ROOT)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


class _Timeline:
    """Which test module was running on a worker at a given moment."""

    def __init__(self, phases: list[dict]):
        self.by_worker: dict[str, tuple[list[float], list[dict]]] = {}
        grouped = defaultdict(list)
        for p in phases:
            grouped[p["worker"]].append(p)
        for w, ps in grouped.items():
            ps.sort(key=lambda p: p["start"])
            self.by_worker[w] = ([p["start"] for p in ps], ps)

    def module_at(self, worker: str, t: float) -> str:
        starts, ps = self.by_worker.get(worker, ([], []))
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return "(before the first test)"
        return ps[i]["test"].split("::")[0]


def build_profile(d: Path) -> dict:
    rows = _jsonl(d / "timeline")
    phases = [r for r in rows if "test" in r]
    fixtures = [r for r in rows if "fixture" in r]
    events = _jsonl(d / "events")
    passes = _jsonl(d / "passes.jsonl")
    timeline = _Timeline(phases)

    modules: dict[str, dict] = defaultdict(
        lambda: {"seconds": 0.0, "setup_s": 0.0, "call_s": 0.0, "teardown_s": 0.0, "tests": set(), "workers": set()}
    )
    for p in phases:
        m = modules[p["test"].split("::")[0]]
        s = p["stop"] - p["start"]
        m["seconds"] += s
        m[f"{p['phase']}_s"] += s
        m["tests"].add(p["test"])
        m["workers"].add(p["worker"])
    starts = {k: {"count": 0, "seconds_total": 0.0, "by_module": defaultdict(lambda: [0, 0.0])} for k in KINDS}
    for e in events:
        if e["kind"] not in starts:
            continue
        mod = timeline.module_at(e["worker"], e["start"])
        k = starts[e["kind"]]
        k["count"] += 1
        k["seconds_total"] += e["seconds"]
        k["by_module"][mod][0] += 1
        k["by_module"][mod][1] += e["seconds"]
        ms = modules[mod].setdefault("starts", {})
        ms[e["kind"]] = ms.get(e["kind"], 0) + 1
    by_module = {
        name: {
            "seconds": round(m["seconds"], 1),
            "setup_s": round(m["setup_s"], 1),
            "call_s": round(m["call_s"], 1),
            "teardown_s": round(m["teardown_s"], 1),
            "tests": len(m["tests"]),
            "workers": sorted(m["workers"]),
            "starts": m.get("starts", {}),
        }
        for name, m in sorted(modules.items(), key=lambda kv: -kv[1]["seconds"])
    }
    tests = defaultdict(float)
    for p in phases:
        tests[p["test"]] += p["stop"] - p["start"]
    return {
        "what": "where the test suite's time goes (tests/support/suite_profile.py)",
        "command": os.environ.get("SPECEXIT_TEST_PROFILE_COMMAND", " ".join(sys.argv)),
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine(),
        "passes": passes,
        "wall_s": round(sum(p["wall_s"] for p in passes), 1),
        "test_seconds": round(sum(p["stop"] - p["start"] for p in phases), 1),
        "tests": len(tests),
        "failed": sorted({p["test"] for p in phases if p["outcome"] == "failed"}),
        "starts": {
            k: {
                "count": v["count"],
                "seconds_total": round(v["seconds_total"], 1),
                "seconds_mean": round(v["seconds_total"] / v["count"], 1) if v["count"] else None,
                "by_module": {
                    m: {"count": c, "seconds": round(s, 1)}
                    for m, (c, s) in sorted(v["by_module"].items(), key=lambda kv: -kv[1][1])
                },
            }
            for k, v in starts.items()
        },
        "by_module": by_module,
        "fixture_setups": [
            {
                "fixture": f["fixture"],
                "scope": f["scope"],
                "module": f["module"],
                "seconds": round(f["stop"] - f["start"], 1),
            }
            for f in sorted(fixtures, key=lambda f: f["start"] - f["stop"])
        ],
        "slowest_tests": [
            {"test": t, "seconds": round(s, 1)} for t, s in sorted(tests.items(), key=lambda kv: -kv[1])[:40]
        ],
    }


if __name__ == "__main__":
    # scripts/test.sh: `reset` empties the profile folder before a run (each pass rewrites profile.json at its end)
    import shutil

    folder = profile_dir()
    if folder is not None and sys.argv[1:] == ["reset"]:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
