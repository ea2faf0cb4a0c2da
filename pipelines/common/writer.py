"""The last Ray Data stage of the traces and labels jobs: write each chunk as its own part.

Writing happens in the Ray tasks (not through the driver); the driver only consumes a one-row
summary per part, which drives the progress log and the final tally.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import pyarrow as pa

from pipelines.common.parts import part_files, write_part
from pipelines.common.schemas import SCHEMAS

log = logging.getLogger("specexit.pipelines")

# Test hook: once N parts were committed by this run, the next writer SIGKILLs the driver and dies
# itself between its temp write and the rename: a job that dies midway (what a lost head node or
# an OOM kill does), leaving a stale temp file behind. Done in the writer tasks because the driver
# consumes results later than they are written; so it needs writers and driver on one machine.
# Used by the resume tests; never set in production.
KILL_AFTER_PARTS_ENV = "SPECEXIT_TEST_KILL_AFTER_PARTS"
# Test hook: the first N writers of this run die (os._exit, what an OOM kill or a lost node does to
# a worker) right *after* committing their part, once each (a `.test-died-<part>` marker remembers
# it). Ray retries the task, which writes the same rows again: the retry test checks that the
# output still holds each id once. Never set in production.
DIE_AFTER_COMMIT_ENV = "SPECEXIT_TEST_DIE_AFTER_COMMIT"
DIED_MARKER = ".test-died-"
# Test hook: once N parts were committed by this run, every later writer waits (10 minutes) before
# writing: the job still has rows to write whenever the test then loses its head (the head-restart drill;
# without it the toy's labels job wrote every part within the second the test took to kill the cluster).
# Never set in production.
STALL_AFTER_PARTS_ENV = "SPECEXIT_TEST_STALL_AFTER_PARTS"


def write_batch(
    batch: pa.Table,
    *,
    folder: str,
    schema_name: str,
    kill: tuple[int, int, int] | None = None,
    die_after_commit: int = 0,
    stall: tuple[int, int] | None = None,
) -> dict:
    schema = SCHEMAS[schema_name]
    cols = {}
    for f in schema:
        col = batch.column(f.name) if f.name in batch.column_names else pa.nulls(batch.num_rows)
        cols[f.name] = col.cast(f.type)
    table = pa.table(cols, schema=schema)
    if stall is not None and _run_wrote(folder, *stall):
        time.sleep(600)
    name = write_part(folder, table, before_commit=None if kill is None else lambda: _maybe_die(folder, *kill))
    if die_after_commit:
        _maybe_die_after_commit(folder, name, die_after_commit)
    status = table.column("status").to_pylist()
    n_ok = status.count("ok")
    return {
        "part": [name],
        "rows": [len(status)],
        "ok": [n_ok],
        "errors": [len(status) - n_ok],
        "t0": [_edge(batch, "_t0", min)],
        "t1": [_edge(batch, "_t1", max)],
    }


def _edge(batch: pa.Table, col: str, pick) -> float | None:
    """Engine-side wall-clock stamps the stages attach (`_t0` request start, `_t1` end): their span
    over the whole run is the engine-busy window, i.e. throughput without engine start-up."""
    if col not in batch.column_names:
        return None
    vals = [v for v in batch.column(col).to_pylist() if v is not None]
    return pick(vals) if vals else None


def _run_wrote(folder: str, parts_before: int, n: int) -> bool:
    """This run has committed `n` parts (the folder held `parts_before` when it started): the test hooks' trigger."""
    return len(part_files(folder)) - parts_before >= n


def _maybe_die(folder: str, driver_pid: int, parts_before: int, after: int) -> None:
    if _run_wrote(folder, parts_before, after):
        os.kill(driver_pid, signal.SIGKILL)
        os._exit(1)


def _maybe_die_after_commit(folder: str, name: str, first_n: int) -> None:
    """Die once per part, for at most `first_n` parts: each death claims a numbered slot with an
    exclusive create, so concurrent writers cannot exceed the count."""
    marker = os.path.join(folder, DIED_MARKER + name)
    if os.path.exists(marker):  # this is the retry
        return
    for k in range(first_n):
        try:
            os.close(os.open(os.path.join(folder, f"{DIED_MARKER}slot-{k}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        open(marker, "w").close()
        os._exit(1)


def write_parts(ds, *, folder: str, schema_name: str, chunk_rows: int, total: int, stage: str) -> dict:
    """Run the pipeline to the end; returns rows/ok/errors written in this run and the engine-busy
    window (t0, t1: wall clock of the first request and the last answer)."""
    kill_after = int(os.environ.get(KILL_AFTER_PARTS_ENV, "0") or 0)
    kill = (os.getpid(), len(part_files(folder)), kill_after) if kill_after else None
    die_after_commit = int(os.environ.get(DIE_AFTER_COMMIT_ENV, "0") or 0)
    stall_after = int(os.environ.get(STALL_AFTER_PARTS_ENV, "0") or 0)
    stall = (len(part_files(folder)), stall_after) if stall_after else None
    out = ds.map_batches(
        write_batch,
        fn_kwargs={
            "folder": folder,
            "schema_name": schema_name,
            "kill": kill,
            "die_after_commit": die_after_commit,
            "stall": stall,
        },
        batch_size=chunk_rows,
        batch_format="pyarrow",
        num_cpus=0.25,
    )
    done = {"parts": 0, "rows": 0, "ok": 0, "errors": 0, "t0": None, "t1": None}
    start = time.time()
    for rec in out.iter_rows():
        done["parts"] += 1
        for k in ("rows", "ok", "errors"):
            done[k] += int(rec[k])
        if rec["t0"] is not None:
            done["t0"] = rec["t0"] if done["t0"] is None else min(done["t0"], rec["t0"])
        if rec["t1"] is not None:
            done["t1"] = rec["t1"] if done["t1"] is None else max(done["t1"], rec["t1"])
        rate = done["rows"] / max(time.time() - start, 1e-9)
        log.info(
            "[%s] part %s: %d rows (%d/%d this run, %.2f rows/s, %d errors so far)",
            stage,
            rec["part"],
            rec["rows"],
            done["rows"],
            total,
            rate,
            done["errors"],
        )
    return done


def engine_rate(res: dict | None) -> tuple[float | None, float | None]:
    """(rows/s, seconds) over the engine-busy window, from the first request to the last answer."""
    if not res or res.get("t0") is None or res.get("t1") is None or res["t1"] <= res["t0"]:
        return None, None
    span = res["t1"] - res["t0"]
    return round(res["rows"] / span, 3), round(span, 2)
