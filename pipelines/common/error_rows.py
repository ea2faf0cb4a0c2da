"""Error rows versus failures: what a bad row becomes, what fails a task, what fails a job.

- A row the job cannot process because of the row itself (no prompt, a prompt longer than the
  context, an unfinished trace) becomes an *error row*: written, counted, never retried unless the
  stage runs with `retry_errors: true`.
- An engine that dies is not the row's fault: the actor exits (`exit_for_restart`), Ray restarts
  it with a fresh engine and retries the task (the batch), exactly as `ray.data.llm` does for the
  traces stage. Otherwise every later batch on that actor would become error rows.
- A job whose share of error rows exceeds `max_error_rate` still writes every row, then fails
  with a message that says so (`error_rate_failure`).
"""

from __future__ import annotations

import os
import sys

# Retries of one batch on fresh actors after its engine died; a batch that kills its engine every
# time fails the job after this many instead of restarting engines forever.
ENGINE_TASK_RETRIES = 3


def engine_dead(exc: BaseException, llm=None) -> bool:
    """True when `exc` (raised by a vLLM `LLM` call) means the engine itself is gone, not the
    request: vLLM's EngineDeadError, or the engine client saying its core died."""
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:  # pragma: no cover - vLLM is always there where engines run
        EngineDeadError = ()  # noqa: N806
    if EngineDeadError and isinstance(exc, EngineDeadError):
        return True
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    return bool(getattr(getattr(core, "resources", None), "engine_dead", False))


def exit_for_restart(what: str, exc: BaseException) -> None:
    """End this actor process so that Ray restarts it and retries its task. os._exit, not
    ray.actor.exit_actor(): an intended exit is not retried, a died worker is."""
    print(f"[{what}] engine died ({type(exc).__name__}: {exc}); exiting the actor so Ray retries", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def error_rate_failure(summary: dict, max_error_rate: float | None) -> str | None:
    """The message that fails a job whose error rows exceed `max_error_rate` (None: never)."""
    n = summary.get("input_rows") or 0
    rate = summary.get("errors", 0) / n if n else 0.0
    summary["error_rate"] = round(rate, 4)
    if max_error_rate is None or rate <= max_error_rate:
        return None
    return (
        f"{summary['errors']} of {n} rows are error rows ({100 * rate:.1f}%), above max_error_rate "
        f"{max_error_rate:g}; every row is written (see their `error` column). Fix the cause and rerun "
        f"with retry_errors: true to retry them"
    )
