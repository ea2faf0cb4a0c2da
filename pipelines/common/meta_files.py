"""The non-data files a stage keeps in its output folder, beside its Parquet parts.

A stage's output folder opens as a dataset: `pandas.read_parquet(folder)`, `pyarrow.dataset.dataset(folder)`,
`ray.data.read_parquet(folder)`, Spark and DuckDB take every file in it (nested folders included) as data
unless its name starts with `_` or `.` (Spark's `_SUCCESS`, Parquet's `_metadata`, pyarrow's
`ignore_prefixes`). So every file here that is not data starts with `_`, and temporary files with `.`
(`parts.TMP_PREFIX`). Folders written before these names (issue 45) are still read under their old names,
and a file is renamed the next time its stage writes it, so resuming such a folder keeps working.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

RUN_FILE = "_run.json"  # the run's identity (run_identity.py): what a resume must match
SUMMARY_FILE = "_summary.json"  # an evaluation's aggregates and target checks (pipelines/evaluate)
GENERALISATION_FILE = "_generalisation.json"  # the generalisation job's summary over its evaluations
REPORT_DIR = "_report"  # report.md and its PNGs, when written into an output folder
LEGACY = {RUN_FILE: "run.json", SUMMARY_FILE: "summary.json", GENERALISATION_FILE: "generalisation.json"}


def meta_path(folder: str | Path, name: str) -> Path:
    """Where to read metadata file `name` in `folder`: under its name, else under its old one (a folder
    written before the rename). The name's own path when neither exists."""
    p = Path(folder) / name
    if not p.exists() and name in LEGACY and (Path(folder) / LEGACY[name]).exists():
        return Path(folder) / LEGACY[name]
    return p


def write_meta(folder: str | Path, name: str, text: str) -> Path:
    """Write metadata file `name` in `folder` atomically (a reader never sees half a file) and drop the
    file's old name, so the folder holds data only."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".tmp-{uuid.uuid4().hex[:8]}-{name}"
    tmp.write_text(text)
    os.replace(tmp, d / name)
    if name in LEGACY:
        (d / LEGACY[name]).unlink(missing_ok=True)
    return d / name
