"""A stage's output folder holds data only, under the names Parquet readers skip (pipelines/common/meta_files.py),
and folders written before the rename still resume: their `run.json` / `summary.json` are read, and renamed
the next time the stage writes them."""

import json

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from pipelines.common.meta_files import LEGACY, REPORT_DIR, RUN_FILE, SUMMARY_FILE, meta_path, write_meta
from pipelines.common.run_identity import RunIdentityMismatch, check_identity, read_identity, write_identity


def test_every_metadata_name_is_skipped_by_parquet_readers(tmp_path):
    pq.write_table(pa.table({"id": ["a", "b"]}), tmp_path / "part-00000.parquet")
    for name in LEGACY:  # every metadata file, under its current name
        write_meta(tmp_path, name, "{}\n")
    (tmp_path / REPORT_DIR).mkdir()
    (tmp_path / REPORT_DIR / "report.md").write_text("# report\n")
    assert all(name.startswith("_") for name in [*LEGACY, REPORT_DIR])
    assert pads.dataset(tmp_path, format="parquet").count_rows() == 2
    (tmp_path / "run.json").write_text("{}")  # what a folder held before: readers take it for data
    with pytest.raises(Exception, match="(?i)parquet"):
        pads.dataset(tmp_path, format="parquet").count_rows()


def test_a_folder_written_before_the_rename_resumes_and_is_renamed(tmp_path):
    ident = {"config": {"seed": 7}, "models": {}, "input": {}}
    (tmp_path / "run.json").write_text(json.dumps(ident))  # the old name
    assert meta_path(tmp_path, RUN_FILE) == tmp_path / "run.json"
    assert read_identity(tmp_path) == ident
    check_identity(tmp_path, ident, resuming=True, what="traces")  # same run: resumes
    with pytest.raises(RunIdentityMismatch, match="config.seed: 7 -> 8"):
        check_identity(tmp_path, {**ident, "config": {"seed": 8}}, resuming=True, what="traces")
    write_identity(tmp_path, ident)  # the resumed stage writes its identity again
    assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_FILE]
    assert read_identity(tmp_path) == ident


def test_summary_read_under_either_name(tmp_path):
    (tmp_path / "summary.json").write_text('{"n": 1}')
    assert json.loads(meta_path(tmp_path, SUMMARY_FILE).read_text()) == {"n": 1}
    write_meta(tmp_path, SUMMARY_FILE, '{"n": 2}')
    assert not (tmp_path / "summary.json").exists()
    assert json.loads(meta_path(tmp_path, SUMMARY_FILE).read_text()) == {"n": 2}
