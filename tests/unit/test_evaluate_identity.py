"""The evaluate stage's run identity (issue #16 item 10) is the shared one (pipelines/common/run_identity.py):
config minus run-only keys, target and draft weights by content, the exit setting used, the input row
by row. No cluster, no engine: `check_run_identity` and `check_input_rows` on a folder of parts."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest

from pipelines.common.parts import write_part
from pipelines.common.run_identity import RunIdentityMismatch, write_identity
from pipelines.evaluate.job import check_input_rows, check_run_identity, toy_eval_config
from specexit_core.toy.paths import DRAFT_DIR

_PART = pa.schema([("id", pa.string()), ("problem_id", pa.string()), ("prompt", pa.string()), ("gold", pa.string())])


def _written(tmp_path, problems: dict[str, str], draft=DRAFT_DIR, **kw):
    """An evaluation output with one part (one row per problem) and the run.json it was written with."""
    cfg = toy_eval_config(draft=str(draft), n=4, output=str(tmp_path / "out"), **kw)
    rows = [{"id": f"{p}/T0/plain", "problem_id": p, "prompt": q, "gold": "1"} for p, q in problems.items()]
    write_part(cfg.output, pa.Table.from_pylist(rows, _PART))
    write_identity(cfg.output, check_run_identity(cfg))
    return cfg


def test_resume_allows_run_only_keys_and_refuses_a_changed_setting(tmp_path):
    cfg = _written(tmp_path, {"a": "q"})
    for n, same in (
        (2, dict(batch_size=3, concurrency=2, accuracy_tolerance=0.5)),  # n: `limit` and the toy `input.n`
        (4, dict(ray={"num_cpus": 1}, engine={**cfg.engine.model_dump(), "max_num_seqs": 3, "concurrency": 2})),
    ):
        check_run_identity(toy_eval_config(draft=str(DRAFT_DIR), n=n, output=cfg.output, **same))
    changed = toy_eval_config(draft=str(DRAFT_DIR), n=4, output=cfg.output, seed=123)
    with pytest.raises(RunIdentityMismatch, match=r"evaluate: .*refusing to resume.*config\.seed: 0 -> 123"):
        check_run_identity(changed)
    with pytest.raises(RunIdentityMismatch, match=r"specexit_exit\.confidence_threshold"):
        check_run_identity(
            toy_eval_config(draft=str(DRAFT_DIR), n=4, output=cfg.output, specexit_exit={"confidence_threshold": 0.5})
        )


def test_a_retrained_draft_at_the_same_path_is_refused(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(DRAFT_DIR, draft)
    cfg = _written(tmp_path, {"a": "q"}, draft=draft)
    check_run_identity(cfg)
    weights = next(p for p in sorted(draft.iterdir()) if p.suffix in (".safetensors", ".pt", ".bin"))
    with open(weights, "r+b") as fh:  # same size, other bytes: what retraining in place does
        fh.seek(0, 2)
        fh.seek(fh.tell() - 8)
        fh.write(b"retrain!")
    with pytest.raises(RunIdentityMismatch, match=r"models\.draft: "):
        check_run_identity(cfg)


def test_input_rows_checked_id_by_id(tmp_path):
    cfg = _written(tmp_path, {"row-00000000": "a", "row-00000001": "b"})
    rows = [{"id": f"row-{i:08d}", "prompt": p, "gold": "1"} for i, p in enumerate("abc")]
    check_input_rows(cfg, rows)  # appended problems are fine
    check_input_rows(cfg, rows[:1])  # a smaller limit too
    shifted = [{"id": f"row-{i:08d}", "prompt": p, "gold": "1"} for i, p in enumerate("xab")]
    with pytest.raises(RunIdentityMismatch, match=r"evaluate: the input changed under 2 id\(s\).*positions"):
        check_input_rows(cfg, shifted)
    with pytest.raises(RunIdentityMismatch, match="row-00000000"):
        check_run_identity(cfg, shifted)


def test_output_of_an_older_run_json_is_adopted_and_a_fresh_folder_never_refuses(tmp_path):
    cfg = _written(tmp_path, {"a": "q"})
    (tmp_path / "out" / "run.json").write_text(json.dumps({"seed": 7, "draft": str(DRAFT_DIR)}))  # before #16
    ident = check_run_identity(cfg)
    assert ident["stage"] == "evaluate" and set(ident["models"]) == {"engine.model", "draft"}
    fresh = toy_eval_config(draft=str(DRAFT_DIR), n=4, output=str(tmp_path / "new"), seed=5)
    check_run_identity(fresh)


def test_cli_refuses_before_starting_ray_and_exits_2(tmp_path, capsys, monkeypatch):
    import pipelines.common.runtime as runtime
    from pipelines.evaluate.job import main
    from support.paths import REPO_ROOT

    cfg = _written(tmp_path, {"a": "q"}, seed=123)
    monkeypatch.setattr(runtime, "init_ray", lambda *a, **k: pytest.fail("Ray started for a refused resume"))
    assert main(["--config", str(REPO_ROOT / "examples/toy/evaluate.yaml"), "--output", cfg.output]) == 2
    assert "config.seed: 123 -> 0" in capsys.readouterr().err
