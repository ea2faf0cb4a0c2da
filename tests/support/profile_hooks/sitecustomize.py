"""Suite profiling hooks, loaded by every Python process a profiled test run starts.

`SPECEXIT_TEST_PROFILE=1 bash scripts/test.sh` puts this folder on PYTHONPATH (tests/conftest.py), so the
test processes, the CLI runs they start, Ray's head, workers and Serve replicas, and vLLM's engine
processes all import it at start-up. It records, as JSON lines under $SPECEXIT_TEST_PROFILE_DIR/events/,
what the suite starts that is expensive, and how long each start took:

- `ray_cluster`: an in-process `ray.init()` that started a head of its own, or a `ray start --head`;
- `vllm_engine`: a vLLM engine started, as its front end sees it (`LLMEngine` / `AsyncLLM` built: engine
  processes spawned, model loaded, KV cache allocated, warmed up);
- `vllm_engine_core`: the part of that inside the engine core process (`EngineCore.__init__`);
- `serve_app`: a Serve application, from the controller creating it to its first RUNNING status.

tests/support/suite_profile.py turns them, with the tests' own timeline, into the profile JSON. Nothing
here changes what a process does; without SPECEXIT_TEST_PROFILE_DIR it does nothing.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import time

from after_import import AfterImport  # this folder is on sys.path wherever this file is loaded

_DIR = os.environ.get("SPECEXIT_TEST_PROFILE_DIR")
_PROCESS_START = time.time()
_installed = False


def worker_key() -> str:
    """Which pass and pytest worker this process belongs to (inherited from the test process that started it)."""
    return f"{os.environ.get('SPECEXIT_TEST_PASS', 'pytest')}:{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def record(kind: str, start: float, stop: float, **detail) -> None:
    """Append one start event for this process (one file per process: no locking across processes)."""
    if not _DIR:
        return
    row = {
        "kind": kind,
        "start": round(start, 3),
        "stop": round(stop, 3),
        "seconds": round(stop - start, 3),
        "worker": worker_key(),
        "pid": os.getpid(),
        **detail,
    }
    try:
        os.makedirs(os.path.join(_DIR, "events"), exist_ok=True)
        with open(os.path.join(_DIR, "events", f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError:
        pass


def _timed_ray_init(init):
    @functools.wraps(init)
    def wrapper(*args, **kwargs):
        t0 = time.time()
        out = init(*args, **kwargs)
        node = sys.modules["ray._private.worker"]._global_node
        if node is not None and getattr(node, "head", False):  # this process started a head of its own
            record("ray_cluster", t0, time.time(), how="ray.init")
        return out

    return wrapper


def _patch_ray_worker(mod) -> None:
    mod.init = _timed_ray_init(mod.init)
    ray = sys.modules.get("ray")
    if ray is not None and hasattr(ray, "init"):  # `ray` already re-exported the unwrapped one
        ray.init = mod.init


def _timed_init(cls, kind: str) -> None:
    init = cls.__init__

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        t0 = time.time()
        init(self, *args, **kwargs)
        record(kind, t0, time.time(), engine=type(self).__name__)  # only the base is wrapped: once per engine

    cls.__init__ = wrapper


def _patch_application_state(mod) -> None:
    cls = mod.ApplicationState
    init, update_status = cls.__init__, cls._update_status

    @functools.wraps(init)
    def new_init(self, name, *args, **kwargs):
        init(self, name, *args, **kwargs)
        self._specexit_profile_t0 = time.time()

    @functools.wraps(update_status)
    def new_update_status(self, status, *args, **kwargs):
        update_status(self, status, *args, **kwargs)
        t0 = getattr(self, "_specexit_profile_t0", None)
        if t0 is not None and str(getattr(status, "value", status)) == "RUNNING":
            self._specexit_profile_t0 = None  # the first RUNNING only
            record("serve_app", t0, time.time(), app=self._name)

    cls.__init__, cls._update_status = new_init, new_update_status


PATCHES = {
    "ray._private.worker": _patch_ray_worker,
    "vllm.v1.engine.core": lambda mod: _timed_init(mod.EngineCore, "vllm_engine_core"),
    "vllm.v1.engine.llm_engine": lambda mod: _timed_init(mod.LLMEngine, "vllm_engine"),
    "vllm.v1.engine.async_llm": lambda mod: _timed_init(mod.AsyncLLM, "vllm_engine"),
    "ray.serve._private.application_state": _patch_application_state,
}


def _patch(module) -> None:
    try:
        PATCHES[module.__name__](module)
    except Exception as e:  # a Ray or vLLM upgrade moved a name: profile less, never break the run
        print(f"[suite profile] could not hook {module.__name__}: {e!r}", file=sys.stderr)


def _is_ray_start_head(argv: list[str]) -> bool:
    return os.path.basename(argv[0]) == "ray" and "start" in argv[1:3] and "--head" in argv


def install() -> None:
    global _installed
    if not _DIR or _installed:
        return
    _installed = True
    sys.meta_path.insert(0, AfterImport(PATCHES, _patch))
    for name in PATCHES:  # loaded before this ran (a test process that imported ray first)
        if name in sys.modules:
            _patch(sys.modules[name])
    if _is_ray_start_head(sys.argv):  # `ray start --head` returns once the head is up
        atexit.register(lambda: record("ray_cluster", _PROCESS_START, time.time(), how="ray start --head"))


install()
