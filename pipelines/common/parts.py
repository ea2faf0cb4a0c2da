"""Chunked, resumable, idempotent Parquet output: a folder of `part-*.parquet` files.

Why: a job killed midway (node loss, `ray job stop`, OOM) must be resubmittable without losing or
duplicating rows, and Ray may run a writer twice (a task retried after its worker died, a block
reconstructed after its object was lost) after the first run already committed the part.

- Atomic: each chunk is written to a hidden temp file and renamed into place (rename is atomic on
  a POSIX file system), so a visible part is always complete. Leftover temp files are deleted on
  start.
- Idempotent: a part is named by a hash of its row ids, so writing the same rows again (a retry)
  replaces the same file instead of adding a second copy.
- One row per id on read: should two parts still hold one id (a retried batch formed differently,
  an error row retried with `retry_errors`), every reader here keeps one row (`ok` over error, then
  the newest part) and `repair_duplicates` rewrites the folder so that the files agree.

Two jobs writing the same folder at the same time are not supported. The folder must be reachable
from every node that runs a writer task (local disk on one machine, NFS / a cluster file system).
"""

from __future__ import annotations

import hashlib
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


def part_name(ids: list[str]) -> str:
    """The file name of the part holding exactly these row ids (order does not matter)."""
    h = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:24]
    return f"part-{h}.parquet"


def write_part(folder: str | Path, table: pa.Table, before_commit=None) -> str:
    """Write one chunk atomically under its id-hash name (a rewrite of the same ids replaces it);
    returns the file name. `before_commit()` runs between the temp write and the rename (the resume
    tests kill the job there)."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    ids = table.column("id").to_pylist() if "id" in table.column_names else None
    name = part_name(ids) if ids else f"part-{uuid.uuid4().hex[:24]}.parquet"
    tmp = d / f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}-{name}"  # unique: two attempts may overlap
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


# -- one row per id -------------------------------------------------------------------------------
def _has(f: Path, column: str) -> bool:
    return column in pq.read_schema(f).names


def _keys(files: list[Path]) -> list[tuple[list, list, float]]:
    """(ids, statuses, mtime) per part; statuses are None where a part has no status column."""
    out = []
    for f in files:
        cols = ["id", "status"] if _has(f, "status") else ["id"]
        t = pq.read_table(f, columns=cols)
        ids = t.column("id").to_pylist()
        status = t.column("status").to_pylist() if "status" in cols else [None] * len(ids)
        out.append((ids, status, f.stat().st_mtime))
    return out


def keep_masks(keys: list[tuple[list, list, float]]) -> list[list[bool]]:
    """Which rows to keep, part by part, so that each id is kept once: an `ok` row over an error
    row, then the row of the part written last (a retried error row replaces the old one)."""
    chosen: dict[str, tuple[int, int]] = {}
    for p, (ids, status, mtime) in enumerate(keys):
        for r, (i, s) in enumerate(zip(ids, status)):
            prev = chosen.get(i)
            if prev is None:
                chosen[i] = (p, r)
                continue
            prev_ok = keys[prev[0]][1][prev[1]] == "ok"
            if (s == "ok", mtime) > (prev_ok, keys[prev[0]][2]):
                chosen[i] = (p, r)
    keep = [[False] * len(k[0]) for k in keys]
    for p, r in chosen.values():
        keep[p][r] = True
    return keep


def read_all(folder: str | Path, columns: list[str] | None = None) -> pa.Table:
    """Every part, one row per id (see `keep_masks`); `columns` as asked."""
    files = part_files(folder)
    if not files:
        raise FileNotFoundError(f"no part-*.parquet files in {folder}")
    if not _has(files[0], "id"):
        return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])
    masks = keep_masks(_keys(files))
    tables = [pq.read_table(f, columns=columns).filter(pa.array(m, pa.bool_())) for f, m in zip(files, masks)]
    return pa.concat_tables(tables)


def read_column(folder: str | Path, column: str) -> list:
    """One column over every part, one row per id, in part order."""
    files = part_files(folder)
    return read_all(folder, [column]).column(column).to_pylist() if files else []


def done_ids(folder: str | Path, *, retry_errors: bool = False) -> set[str]:
    """Ids a resumed job skips: every id written, or with `retry_errors` only the `ok` ones."""
    files = part_files(folder)
    if not files:
        return set()
    t = read_all(folder, ["id", "status"])
    ids, status = t.column("id").to_pylist(), t.column("status").to_pylist()
    return {i for i, s in zip(ids, status) if s == "ok" or not retry_errors}


def repair_duplicates(folder: str | Path) -> int:
    """Rewrite the parts that hold a second row of some id without it (atomically, one part at a
    time; a part left empty is deleted), so the files themselves hold each id once. Returns the
    number of rows removed. Run by the driver before and after the writers, never during."""
    files = part_files(folder)
    keys = _keys(files)
    removed = 0
    for f, mask in zip(files, keep_masks(keys)):
        drop = mask.count(False)
        if not drop:
            continue
        removed += drop
        if drop == len(mask):
            f.unlink()
            continue
        t = pq.read_table(f).filter(pa.array(mask, pa.bool_()))
        tmp = f.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}-{f.name}")
        pq.write_table(t, tmp)
        os.replace(tmp, f)
    return removed


def raw_id_counts(folder: str | Path) -> dict[str, int]:
    """How often each id occurs in the files (before the one-row-per-id rule)."""
    counts: dict[str, int] = {}
    for ids, _, _ in _keys(part_files(folder)):
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
    return counts


def tally(folder: str | Path, expected_ids: list[str]) -> dict:
    """ok / error counts over the output (one row per id) and whether every expected id is there
    exactly once in the files (`duplicates`: extra copies still in the files)."""
    files = part_files(folder)
    t = read_all(folder, ["id", "status"]) if files else pa.table({"id": [], "status": []})
    status = dict(zip(t.column("id").to_pylist(), t.column("status").to_pylist()))
    counts = raw_id_counts(folder)
    expected = set(expected_ids)
    ok = sum(1 for i in expected if status.get(i) == "ok")
    err = sum(1 for i in expected if i in status and status[i] != "ok")
    missing = len(expected - set(status))
    dup = sum(counts[i] - 1 for i in expected if i in counts)
    return {
        "input_rows": len(expected),
        "ok": ok,
        "errors": err,
        "missing": missing,
        "duplicates": dup,
        "complete": missing == 0 and dup == 0 and ok + err == len(expected),
    }
