"""Chunked, resumable Parquet output: a folder of `part-*.parquet` files.

Why: a job killed midway (node loss, `ray job stop`, OOM) must be resubmittable without losing or
duplicating rows. Each finished chunk is written to a hidden temp file and renamed into place
(rename is atomic on a POSIX file system), so a visible part is always complete. On start the job
reads the ids of the visible parts, skips them, and deletes leftover temp files. Two jobs writing
the same folder at the same time are not supported.

The folder must be reachable from every node that runs a writer task (local disk on one machine,
NFS / a cluster file system otherwise).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TMP_PREFIX = ".tmp-"


def part_files(folder: str | Path) -> list[Path]:
    """Visible parts in a stable order (sorted by name)."""
    d = Path(folder)
    return sorted(d.glob("part-*.parquet")) if d.is_dir() else []


def clean_tmp(folder: str | Path) -> int:
    d = Path(folder)
    n = 0
    if d.is_dir():
        for f in d.glob(TMP_PREFIX + "*"):
            f.unlink(missing_ok=True)
            n += 1
    return n


def read_column(folder: str | Path, column: str) -> list:
    out: list = []
    for f in part_files(folder):
        out.extend(pq.read_table(f, columns=[column]).column(column).to_pylist())
    return out


def done_ids(folder: str | Path) -> set[str]:
    return set(read_column(folder, "id"))


def write_part(folder: str | Path, table: pa.Table, before_commit=None) -> str:
    """Write one chunk atomically; returns the part's file name. `before_commit()` runs between
    the temp write and the rename (the resume tests kill the job there)."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    name = f"part-{uuid.uuid4().hex[:16]}.parquet"
    tmp = d / (TMP_PREFIX + name)
    pq.write_table(table, tmp)
    with open(tmp, "rb") as fh:  # data on disk before the rename makes it visible
        os.fsync(fh.fileno())
    if before_commit is not None:
        before_commit()
    os.replace(tmp, d / name)
    return name


def keep_ids(batch: pa.Table, *, ids: list[str]) -> pa.Table:
    """Ray Data map_batches filter: only the rows whose id is in `ids`."""
    return batch.filter(pc.is_in(batch.column("id"), value_set=pa.array(ids, pa.string())))


def read_all(folder: str | Path, columns: list[str] | None = None) -> pa.Table:
    files = part_files(folder)
    if not files:
        raise FileNotFoundError(f"no part-*.parquet files in {folder}")
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])


def tally(folder: str | Path, expected_ids: list[str]) -> dict:
    """ok / error counts over the output and whether every expected id is there exactly once."""
    ids = read_column(folder, "id")
    status = read_column(folder, "status")
    expected = set(expected_ids)
    seen: dict[str, int] = {}
    ok = err = 0
    for i, s in zip(ids, status):
        if i not in expected:
            continue
        seen[i] = seen.get(i, 0) + 1
        ok += s == "ok"
        err += s != "ok"
    missing = len(expected - set(seen))
    dup = sum(c - 1 for c in seen.values())
    return {
        "input_rows": len(expected),
        "ok": ok,
        "errors": err,
        "missing": missing,
        "duplicates": dup,
        "complete": missing == 0 and dup == 0 and ok + err == len(expected),
    }
