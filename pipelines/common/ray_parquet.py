"""Opening Parquet files as a Ray dataset without a process per footer.

Ray Data 2.60 lists Parquet input on a pool of footer-reader actors, 32 by default for every
`read_parquet` whatever the number of files (`RAY_DATA_PARQUET_FOOTER_NUM_ACTORS`,
ray/data/_internal/datasource_v2/formats/parquet/footer_file_indexer.py). Each actor is a Ray worker
process of its own: on a 2-core machine a labels job reading five part files started ~20 worker
processes (each importing Ray, ~1 CPU-second) to read five footers, every time a stage read its input.
A stage reads one footer reader per `FILES_PER_FOOTER_READER` files, Ray's default at most; the count is
read when the dataset is planned (in this process), so it is set around that call only, and a value
the user exported wins.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

FOOTER_READERS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
RAY_FOOTER_READERS = 32  # Ray Data's default pool size
FILES_PER_FOOTER_READER = 64  # one actor reads this many footers in well under a second


def footer_readers(n_files: int) -> int:
    """Footer-reader actors for `n_files` files: 1 up to 64 files, then one per 64, at most Ray's 32."""
    return max(1, min(RAY_FOOTER_READERS, math.ceil(n_files / FILES_PER_FOOTER_READER)))


@contextlib.contextmanager
def _footer_readers_env(n_files: int):
    if FOOTER_READERS_ENV in os.environ:  # the user's choice
        yield
        return
    os.environ[FOOTER_READERS_ENV] = str(footer_readers(n_files))
    try:
        yield
    finally:
        os.environ.pop(FOOTER_READERS_ENV, None)


def read_parquet(paths: str | list[str] | list[Path], columns: list[str] | None = None):
    """`ray.data.read_parquet` with a footer-reader pool sized to the input: `paths` is a list of
    files, or one file or folder (its `*.parquet` files, nested ones included, are counted)."""
    import ray

    if isinstance(paths, (str, Path)):
        p = Path(paths)
        n = sum(1 for _ in p.rglob("*.parquet")) if p.is_dir() else 1  # a remote URI: counted as one
        arg: str | list[str] = str(paths)
    else:
        arg = [str(f) for f in paths]
        n = len(arg)
    with _footer_readers_env(n):
        ds = ray.data.read_parquet(arg)
    return ds if columns is None else ds.select_columns(columns)  # pushed down into the read
