"""A rerun of a finished train_draft run (its `output` records the same run identity and name at the
configured `steps`) starts nothing, no Ray and no Ray Train workers, and reports the recorded
summary with `skipped: true`; more steps, another run name or other labels train on."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.common.parts import part_files
from pipelines.common.train_run import RECORD, finished_run
from pipelines.train_draft.config import TrainDraftConfig
from pipelines.train_draft.job import identity, run
from specexit_core.toy.paths import TEACHER_DIR


def _cfg(tmp_path, **kw) -> TrainDraftConfig:
    labels = tmp_path / "labels"
    if not labels.exists():
        labels.mkdir()
        pq.write_table(pa.table({"id": ["a", "b"], "status": ["ok", "ok"]}), labels / "part-00000.parquet")
    base = dict(
        input=str(labels),
        output=str(tmp_path / "draft"),
        target=str(TEACHER_DIR),
        run_name="r",
        storage_path=str(tmp_path / "runs"),
        steps=3,
        draft_vocab_size=160,
        num_workers=1,
        use_gpu=False,
    )
    return TrainDraftConfig(**{**base, **kw})


def test_a_finished_run_is_reported_not_retrained(tmp_path):
    cfg = _cfg(tmp_path)
    ident = identity(cfg, part_files(cfg.input))
    summary = {"stage": "train_draft", "complete": True, "run_name": "r", "step": 3, "loss": 0.5}
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / RECORD).write_text(json.dumps({"summary": summary, "run_identity": ident}))

    out = run(cfg)  # the unit tests' guard fails the test if this started a Ray cluster
    assert out["skipped"] is True and {k: out[k] for k in summary} == summary

    assert finished_run(cfg.output, ident, "r", 4) is None  # more steps: train on
    assert finished_run(cfg.output, ident, "other", 3) is None
    other = identity(_cfg(tmp_path, lr=1e-4), part_files(cfg.input))
    assert finished_run(cfg.output, other, "r", 3) is None
