"""Batch-job reliability without a cluster (issue #16 items 8-11): idempotent part writes and one row
per id on read, error rows versus engine death, the error-rate limit, run identities, the atomic
draft export and weights-only checkpoint loading. The Ray-level versions of the retry and
engine-death checks are in tests/integration (test_pipelines_sources.py, test_pipelines_jobs.py)."""

from __future__ import annotations

import ast
import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from pipelines.common import error_rows
from pipelines.common.parts import done_ids, part_files, read_all, read_column, repair_duplicates, tally, write_part
from pipelines.common.run_identity import (
    RunIdentityMismatch,
    check_identity,
    model_fingerprint,
    write_identity,
)
from pipelines.common.schemas import LABELS, TRACES, empty_row, to_table
from pipelines.common.stage_cli import main
from pipelines.common.writer import write_batch
from pipelines.traces.config import TracesConfig
from support.paths import REPO_ROOT


def _trace(i: str, status: str = "ok", prompt: str = "q", gold: str = "1") -> dict:
    if status != "ok":
        return empty_row(TRACES, i, "bad", prompt=prompt, gold=gold)
    return dict(empty_row(TRACES, i, ""), status="ok", error=None, prompt=prompt, gold=gold)


# -- item 8: a part written again is the same part; readers keep one row per id ---------------------
def test_same_batch_written_twice_is_one_part(tmp_path):
    """What a retried writer task does: the same rows again. They replace the part, not add one."""
    batch = to_table([_trace(f"r{i}") for i in range(4)], TRACES)
    first = write_batch(batch, folder=str(tmp_path), schema_name="traces")
    again = write_batch(batch.take([2, 0, 3, 1]), folder=str(tmp_path), schema_name="traces")  # any order
    assert first["part"] == again["part"] and len(part_files(tmp_path)) == 1
    t = tally(tmp_path, [f"r{i}" for i in range(4)])
    assert (t["ok"], t["duplicates"], t["complete"]) == (4, 0, True)


def test_the_stall_hook_holds_writers_once_n_parts_of_the_run_are_written(tmp_path, monkeypatch):
    """STALL_AFTER_PARTS_ENV (the head-restart drill's hook): writers wait once the run wrote N parts."""
    from pipelines.common import writer

    slept = []
    monkeypatch.setattr(writer.time, "sleep", slept.append)
    write_part(tmp_path, to_table([_trace("old")], TRACES))  # a part of an earlier run: not counted
    stall = (1, 2)  # (parts when this run started, N)
    for i in range(3):
        write_batch(to_table([_trace(f"r{i}")], TRACES), folder=str(tmp_path), schema_name="traces", stall=stall)
    assert slept == [600]  # the third part of the run waited; the first two did not


def test_readers_keep_one_row_per_id_and_repair_rewrites_the_files(tmp_path):
    write_part(tmp_path, to_table([_trace("a", "error"), _trace("b")], TRACES))
    write_part(tmp_path, to_table([_trace("a"), _trace("c")], TRACES))  # a retried: now ok
    write_part(tmp_path, to_table([_trace("b", "error")], TRACES))  # an ok row never loses to an error
    rows = {r["id"]: r["status"] for r in read_all(tmp_path, ["id", "status"]).to_pylist()}
    assert rows == {"a": "ok", "b": "ok", "c": "ok"}
    assert sorted(read_column(tmp_path, "id")) == ["a", "b", "c"]
    t = tally(tmp_path, ["a", "b", "c"])
    assert (t["ok"], t["errors"], t["duplicates"], t["complete"]) == (3, 0, 2, False)  # the files disagree
    assert repair_duplicates(tmp_path) == 2 and len(part_files(tmp_path)) == 2  # the all-error part is gone
    t = tally(tmp_path, ["a", "b", "c"])
    assert (t["ok"], t["duplicates"], t["complete"]) == (3, 0, True)
    assert repair_duplicates(tmp_path) == 0


def test_evaluation_rows_written_twice_count_once(tmp_path):
    """The evaluate tally reads through read_all: a problem's rows written by two attempts of a
    batch (before the id-hash names, two parts) count once."""
    schema = pa.schema([("id", pa.string()), ("problem_id", pa.string()), ("status", pa.string())])
    rows = pa.Table.from_pylist([{"id": f"p1/T0/{m}", "problem_id": "p1", "status": "ok"} for m in "xy"], schema)
    write_part(tmp_path, rows)
    write_part(tmp_path, rows.slice(0, 1))  # a batch formed differently on the retry
    assert read_all(tmp_path, ["problem_id", "status"]).num_rows == 2


# -- item 9: error rows, retrying them, the error-rate limit, engine death ---------------------------
def test_retry_errors_redoes_only_error_rows(tmp_path):
    write_part(tmp_path, to_table([_trace("a"), _trace("b", "error")], TRACES))
    assert done_ids(tmp_path) == {"a", "b"}
    assert done_ids(tmp_path, retry_errors=True) == {"a"}
    write_part(tmp_path, to_table([_trace("b", "error")], TRACES))  # retried, failed again: newest wins
    assert read_all(tmp_path, ["id"]).num_rows == 2


def test_error_rate_limit_fails_the_job_after_writing():
    s = {"input_rows": 10, "ok": 7, "errors": 3, "complete": True}
    assert error_rows.error_rate_failure(dict(s), None) is None
    assert error_rows.error_rate_failure(dict(s), 0.3) is None
    msg = error_rows.error_rate_failure(s, 0.25)
    assert "3 of 10 rows are error rows (30.0%)" in msg and "max_error_rate 0.25" in msg and s["error_rate"] == 0.3


def test_cli_exit_codes_for_error_rate_and_refused_resume(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps({"output": str(tmp_path / "o"), "engine": {"model": "m"}, "max_error_rate": 0.1}))
    assert main("traces", TracesConfig, lambda cfg: {"complete": True, "failed": "too many"}, ["--config", str(f)]) == 1
    assert "traces: too many" in capsys.readouterr().err

    def refuse(cfg):
        raise RunIdentityMismatch("changed: config.x: 1 -> 2")

    assert main("traces", TracesConfig, refuse, ["--config", str(f)]) == 2
    assert "config.x: 1 -> 2" in capsys.readouterr().err


class _Labeler:
    """ProbeLabeler's batch logic with planning, labeling and the engine faked."""

    def __new__(cls, generate, llm=None):
        from pipelines.labels.labeler import ProbeLabeler

        class L(ProbeLabeler):
            def __init__(self):
                self.llm, self.grader = llm, "toy"

            def _plan(self, row):
                return [[1, 2]], {"ref": "1", "bounds": [5]}

            def _label(self, row, ctx, outcomes):
                return dict(empty_row(LABELS, row["id"], ""), status="ok", error=None, probe_outcomes=outcomes)

            def _generate(self, prompts, keys):
                return [[text] for text in generate(prompts)]

        return L()


def _batch(*ids):
    return pa.Table.from_pylist([{"id": i, "status": "ok", "error": None} for i in ids])


def test_labeler_fails_the_task_when_the_engine_dies(monkeypatch):
    """A probe that fails on its own is its trace's error row; a dead engine exits the actor (Ray
    restarts it and retries the batch) instead of turning the batch into error rows."""
    from vllm.v1.engine.exceptions import EngineDeadError

    import pipelines.labels.labeler as labeler

    def restart(what, exc):
        raise SystemExit(f"restart: {type(exc).__name__}")

    monkeypatch.setattr(labeler, "exit_for_restart", restart)

    calls = []

    def one_bad(prompts):  # the batch fails, then only trace "b" on its own
        calls.append(len(prompts))
        if len(calls) == 1 or len(calls) == 3:
            raise ValueError("prompt rejected")
        return ["The answer is 1 ."] * len(prompts)

    out = _Labeler(one_bad)(_batch("a", "b", "c")).to_pylist()
    assert [r["status"] for r in out] == ["ok", "error", "ok"] and "prompt rejected" in out[1]["error"]

    def dead(prompts):
        raise EngineDeadError()

    with pytest.raises(SystemExit, match="restart: EngineDeadError"):
        _Labeler(dead)(_batch("a", "b"))

    class Core:  # the engine client knows its core died, whatever the exception says
        resources = type("R", (), {"engine_dead": True})()

    llm = type("LLM", (), {"llm_engine": type("E", (), {"engine_core": Core()})()})()

    def broken(prompts):
        raise RuntimeError("zmq: connection reset")

    with pytest.raises(SystemExit, match="restart: RuntimeError"):
        _Labeler(broken, llm)(_batch("a"))


# -- item 10: run identities ------------------------------------------------------------------------
def _traces_cfg(tmp_path, **kw) -> TracesConfig:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    raw = {"output": str(tmp_path / "out"), "engine": {"model": str(model)}, "input": {"kind": "toy"}}
    for k, v in kw.items():
        node = raw
        *parents, last = k.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    return TracesConfig.model_validate(raw)


def test_resume_refuses_another_config_or_model_naming_the_change(tmp_path):
    from pipelines.traces.job import identity

    cfg = _traces_cfg(tmp_path)
    out = Path(cfg.output)
    write_identity(out, identity(cfg))
    for same in (
        _traces_cfg(tmp_path, **{"engine.batch_size": 3, "chunk_rows": 5, "limit": 2, "max_error_rate": 0.5}),
        _traces_cfg(tmp_path, retry_errors=True, **{"input.n": 999}),
    ):
        check_identity(out, identity(same), resuming=True, what="traces")  # how it runs, not what it writes
    with pytest.raises(RunIdentityMismatch, match=r"config\.sampling\.temperature: 0\.6 -> 0\.9"):
        check_identity(out, identity(_traces_cfg(tmp_path, **{"sampling.temperature": 0.9})), resuming=True, what="t")
    check_identity(out, identity(_traces_cfg(tmp_path, **{"sampling.temperature": 0.9})), resuming=False, what="t")
    (tmp_path / "model" / "config.json").write_text('{"hidden_size": 8}')  # other weights, same path
    with pytest.raises(RunIdentityMismatch, match=r"models\.engine\.model: "):
        check_identity(out, identity(cfg), resuming=True, what="traces")


def test_model_fingerprint_follows_content_not_path(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(bytes(3 << 20))  # big: hashed by head and tail
    assert model_fingerprint(a) == model_fingerprint(b) and model_fingerprint("org/name") == "hub:org/name"
    with open(b / "model.safetensors", "r+b") as fh:
        fh.seek((3 << 20) - 10)
        fh.write(b"retrained!")
    assert model_fingerprint(a) != model_fingerprint(b) and model_fingerprint(None) is None


def test_traces_refuse_when_positional_ids_shift(tmp_path):
    """No id column: ids are row-<index>. A line inserted at the top moves every prompt to another id."""
    from pipelines.traces.job import check_input_rows

    cfg = _traces_cfg(tmp_path)
    prompts = ["a", "b", "c"]
    write_part(cfg.output, to_table([_trace(f"row-{i:08d}", prompt=p) for i, p in enumerate(prompts)], TRACES))
    rows = [{"id": f"row-{i:08d}", "prompt": p, "gold": "1"} for i, p in enumerate(prompts + ["d"])]
    check_input_rows(cfg, rows)  # appended rows are fine
    check_input_rows(cfg, rows[:1])  # a smaller limit too
    shifted = [{"id": f"row-{i:08d}", "prompt": p, "gold": "1"} for i, p in enumerate(["new"] + prompts)]
    with pytest.raises(RunIdentityMismatch, match=r"changed under 3 id\(s\).*row-00000000.*positions"):
        check_input_rows(cfg, shifted)


def test_labels_refuse_traces_that_changed(tmp_path):
    from pipelines.labels.config import LabelsConfig
    from pipelines.labels.job import check_input_rows

    traces, labels = tmp_path / "traces", tmp_path / "labels"
    tr = [dict(_trace(i), prompt_token_ids=[1], completion_token_ids=[2, 3]) for i in "ab"]
    write_part(traces, to_table(tr, TRACES))
    lab = [dict(empty_row(LABELS, i, ""), status="ok", error=None, gold="1", prompt_token_ids=[1]) for i in "ab"]
    write_part(labels, to_table([dict(r, completion_token_ids=[2, 3]) for r in lab], LABELS))
    cfg = LabelsConfig.model_validate({"input": str(traces), "output": str(labels), "engine": {"model": "m"}})
    check_input_rows(cfg)
    write_part(traces, to_table([dict(tr[1], completion_token_ids=[2, 4])], TRACES))  # b was resampled
    repair_duplicates(traces)
    with pytest.raises(RunIdentityMismatch, match=r"changed under 1 id\(s\).*\(b\)"):
        check_input_rows(cfg)


def test_probe_sampling_config_identity_and_seeds(tmp_path):
    """k sampled probes per break (#44 item 2): validated early; a labels folder written with one greedy
    probe (before the key existed) still resumes, and refuses a resume that samples its probes; each
    break's k samples are seeded by its trace and position, the same on a rerun."""
    from pipelines.labels.config import LabelsConfig
    from pipelines.labels.job import identity
    from pipelines.labels.labeler import ProbeLabeler
    from specexit_core.typed_config import ConfigError, load_config

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    base = {"input": str(tmp_path / "traces"), "output": str(tmp_path / "labels"), "engine": {"model": str(model)}}
    greedy = LabelsConfig.model_validate(base)
    assert "probe_sampling" not in identity(greedy)["config"]
    sampled = {"samples": 4, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    soft = LabelsConfig.model_validate({**base, "probe_sampling": sampled})
    write_identity(tmp_path / "labels", identity(greedy))
    check_identity(tmp_path / "labels", identity(greedy), resuming=True, what="labels")
    with pytest.raises(RunIdentityMismatch, match=r"probe_sampling\.samples: \"<unset>\" -> 4"):
        check_identity(tmp_path / "labels", identity(soft), resuming=True, what="labels")
    for bad, key in ((dict(sampled, samples=1), "samples"), (dict(sampled, temperature=0), "temperature")):
        f = tmp_path / "bad.yaml"
        f.write_text(json.dumps({**base, "probe_sampling": bad}))
        with pytest.raises(ConfigError, match=f"probe_sampling.{key}"):
            load_config(LabelsConfig, f)

    labeler = ProbeLabeler.__new__(ProbeLabeler)
    labeler.sampling, labeler.probe_max_tokens = soft.probe_sampling.model_dump(), 6
    params = labeler._params(["a@3", "a@7", "b@3"])
    assert all((p.n, p.temperature, p.top_p, p.top_k, p.max_tokens) == (4, 0.6, 0.95, 20, 6) for p in params)
    assert len({p.seed for p in params}) == 3 and [p.seed for p in labeler._params(["a@3"])] == [params[0].seed]


def test_train_run_identity_allows_more_steps_refuses_other_labels_or_lr(tmp_path):
    from pipelines.train_draft.config import TrainDraftConfig
    from pipelines.train_draft.job import identity

    labels = tmp_path / "labels"
    write_part(labels, to_table([dict(empty_row(LABELS, "a", ""), status="ok", error=None)], LABELS))
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    base = dict(input=str(labels), output="d", target=str(target), run_name="r", draft_vocab_size=8)

    def ident(**kw):
        return identity(TrainDraftConfig.model_validate({**base, **kw}), part_files(labels))

    run = tmp_path / "run"
    write_identity(run, ident())
    check_identity(run, ident(steps=500, num_workers=4, output="d2", checkpoint_every=3), resuming=True, what="t")
    # signal_weight came later (ADDED_KEYS): at its default it is not in the identity, a run written
    # before it resumes; another weight is another run
    assert "signal_weight" not in ident()["config"]
    with pytest.raises(RunIdentityMismatch, match=r"config\.signal_weight: \"<unset>\" -> 5\.0"):
        check_identity(run, ident(weighting="fixed", signal_weight=5.0), resuming=True, what="train_draft")
    with pytest.raises(ValueError, match="signal_weight applies with weighting: fixed"):
        ident(signal_weight=5.0)
    assert "end_weight" not in ident()["config"]  # the same for end_weight
    with pytest.raises(RunIdentityMismatch, match=r"config\.end_weight: \"<unset>\" -> 4\.0"):
        check_identity(run, ident(end_weight=4.0), resuming=True, what="train_draft")
    with pytest.raises(RunIdentityMismatch, match=r"config\.lr: "):
        check_identity(run, ident(lr=1e-4), resuming=True, what="train_draft")
    write_part(labels, to_table([dict(empty_row(LABELS, "b", ""), status="ok", error=None)], LABELS))
    with pytest.raises(RunIdentityMismatch, match=r"input\.parts: 1 -> 2"):
        check_identity(run, ident(), resuming=True, what="train_draft")


# -- item 11: atomic export, weights-only checkpoints -----------------------------------------------
def test_draft_export_never_removes_the_live_folder(tmp_path, monkeypatch):
    """A reader of the exported draft sees a whole folder at every moment of repeated exports."""
    import pipelines.common.publish as export
    from pipelines.train_draft.export import export_draft

    src = tmp_path / "ckpt_draft"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(bytes(1 << 16))
    out = tmp_path / "draft"
    export_draft(src, out, {"step": 0})
    misses, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                json.loads((out / "specexit_train.json").read_text())
                (out / "config.json").read_text()
            except (OSError, ValueError) as e:
                misses.append(e)

    swaps = []
    real = export._exchange
    monkeypatch.setattr(export, "_exchange", lambda a, b: swaps.append(real(a, b)) or swaps[-1])
    t = threading.Thread(target=read)
    t.start()
    try:
        for step in range(1, 30):
            export_draft(src, out, {"step": step})
        atomic_misses = list(misses)
        monkeypatch.setattr(export, "_exchange", lambda a, b: False)  # no renameat2: rename aside, then in
        export_draft(src, out, {"step": 99})
    finally:
        stop.set()
        t.join()
    assert swaps and all(swaps)  # renameat2 swapped every time here
    assert not atomic_misses, atomic_misses
    assert json.loads((out / "specexit_train.json").read_text()) == {"step": 99}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_draft", "draft"]  # nothing left behind


def test_checkpoint_state_loads_weights_only(tmp_path):
    """The training state loads (model + AdamW state dicts, step); a pickle that would run code does not."""
    from pipelines.train_draft.loop import load_state

    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95))
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    torch.save({"objective": m.state_dict(), "optimizer": opt.state_dict(), "step": 7}, tmp_path / "state.pt")
    state = load_state(str(tmp_path / "state.pt"), "cpu")
    assert state["step"] == 7 and torch.equal(state["objective"]["weight"], m.weight)
    opt.load_state_dict(state["optimizer"])

    torch.save({"step": _RunsCode()}, tmp_path / "evil.pt")
    _RunsCode.ran = False
    with pytest.raises(Exception, match="Weights only load failed"):
        load_state(str(tmp_path / "evil.pt"), "cpu")
    assert not _RunsCode.ran


class _RunsCode:
    ran = False

    def __reduce__(self):
        return (_mark_ran, ())


def _mark_ran():
    _RunsCode.ran = True
    return 0


def test_every_torch_load_in_the_repo_is_weights_only():
    bad = []
    roots = ("specexit_core", "pipelines", "serve_app", "specexit_app", "cluster", "scripts", "tests")
    for f in (f for r in roots for f in (REPO_ROOT / r).rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                kw = {k.arg: k.value for k in node.keywords}
                if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
                    bad.append(f"{f.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not bad, f"torch.load without weights_only=True: {bad}"
