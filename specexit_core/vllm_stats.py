"""Add a stat logger of our own to one running vLLM engine: the one home for how the project reads the
statistics vLLM's scheduler sends with every engine step (`SchedulerStats`, `IterationStats`).

Why not `LLM.get_metrics()` or Prometheus: those read the process-wide registry, and a second engine in
the same process replaces the first one's collectors, so two engines (EAGLE-3 vs SpecExit) cannot be
told apart. A logger appended to one engine's own `StatLoggerManager` sees that engine's steps only, in
the process that owns the engine (offline `LLM` or a Serve replica's `AsyncLLM`): nothing runs in the
engine core or the workers, so it is the same on the CPU and GPU builds.
Needs the engine built with `disable_log_stats=False` (the scheduler computes no statistics otherwise).
Read by a Serve replica's cache metrics (serve_app/cache_metrics.py) and the benchmarks' counters
(specexit_app/bench/spec_counters.py, step_trace.py); one of the core's vLLM adapters (pyproject.toml).
"""

from __future__ import annotations

from typing import Any, TypeVar

from vllm.v1.metrics.loggers import AggregateStatLoggerBase

L = TypeVar("L", bound="AttachedStatLogger")


class AttachedStatLogger(AggregateStatLoggerBase):
    """Base of the project's stat loggers: subclasses write `record` (and their own `__init__`).
    Built by us and attached to a running engine, so the constructor is not vLLM's factory signature;
    the other hooks of the interface (log, sleep state, admission rejections) keep vLLM's no-op defaults."""

    def __init__(self) -> None:  # noqa: D107 -- vLLM's factory arguments are not needed
        pass

    def log_engine_initialized(self) -> None:
        pass


def logger_manager(engine: Any):
    """The StatLoggerManager of an offline `vllm.LLM` or an `AsyncLLM`; None when it keeps no statistics."""
    inner = getattr(engine, "llm_engine", engine)
    return getattr(inner, "logger_manager", None)


def attach(engine: Any, logger: L) -> L:
    """Append `logger` to the engine's stat loggers; it sees every later engine step."""
    manager = logger_manager(engine)
    if manager is None:
        raise RuntimeError("the engine keeps no stats: build it with disable_log_stats=False")
    manager.stat_loggers.append(logger)
    return logger
