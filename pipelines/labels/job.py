"""`python -m pipelines.labels --config FILE`: per-token SpecExit labels from teacher traces.

traces Parquet -> skip ids already written -> ProbeLabeler actors (vLLM, prefix caching): at every
step boundary of the think segment cut the trace, force `</think>` + answer prompt, decode a short
greedy answer, grade it -> `specexit_core.labels.label_trace` arrays -> Parquet parts (schema:
pipelines/common/schemas.py LABELS). Trace error rows and unfinished traces become error rows here.
"""

from __future__ import annotations

import logging
import os
import time

from pipelines.common.error_rows import ENGINE_TASK_RETRIES, error_rate_failure
from pipelines.common.parts import (
    clean_tmp,
    done_ids,
    keep_ids,
    part_files,
    read_all,
    read_column,
    repair_duplicates,
    tally,
)
from pipelines.common.ray_parquet import read_parquet
from pipelines.common.run_identity import (
    changed_rows,
    check_identity,
    config_identity,
    model_fingerprint,
    refuse_changed_rows,
    write_identity,
)
from pipelines.common.runtime import engine_actors, engine_env, init_ray, use_gpu
from pipelines.common.writer import engine_rate, write_parts
from pipelines.labels.config import LabelsConfig
from pipelines.labels.labeler import KILL_ENGINE_ENV, KILLED_MARKER, ProbeLabeler

log = logging.getLogger("specexit.pipelines.labels")

COLUMNS = ["id", "status", "error", "gold", "answer", "prompt_token_ids", "completion_token_ids"]


def labeler_kwargs(cfg: LabelsConfig, gpu: bool) -> dict:
    e = cfg.engine
    return dict(
        model=e.model,
        engine_kwargs=e.engine_kwargs(),
        env=engine_env(e, gpu),
        grader=cfg.grader,
        close_text=cfg.close_text,
        answer_prompt=cfg.answer_prompt,
        probe_max_tokens=cfg.probe_max_tokens,
        probe_sampling=cfg.probe_sampling.model_dump() if cfg.probe_sampling else None,
        think_start=cfg.think_start,
        think_end=cfg.think_end,
        split_tokens=cfg.split_tokens,
        shift=cfg.shift,
        initial=cfg.initial_confidence,
        gpu=gpu,
    )


def identity(cfg: LabelsConfig) -> dict:
    """What the labels depend on (pipelines/common/run_identity.py); the traces they were made
    from are checked id by id (`check_input_rows`), so the traces folder may grow between runs."""
    return {
        "stage": "labels",
        "config": config_identity(cfg, cfg.RUN_ONLY_KEYS | {"input"}),
        "models": {"engine.model": model_fingerprint(cfg.engine.model)},
    }


def check_input_rows(cfg: LabelsConfig) -> None:
    """Every labeled trace must still be the trace it was labeled from (same tokens, same gold).
    Error rows carry no trace tokens; `retry_errors` redoes them."""
    if not part_files(cfg.output):
        return
    cols = ["id", "status", "gold", "prompt_token_ids", "completion_token_ids"]
    lab, tr = read_all(cfg.output, cols).to_pylist(), read_all(cfg.input, cols).to_pylist()
    key = ("gold", "prompt_token_ids", "completion_token_ids")
    written = {r["id"]: tuple(r[k] for k in key) for r in lab if r["status"] == "ok"}
    refuse_changed_rows(
        "labels",
        cfg.output,
        changed_rows(written, {r["id"]: tuple(r[k] for k in key) for r in tr}),
        f"The traces in {cfg.input} are not the ones these labels were made from; use a new output folder.",
    )


def run(cfg: LabelsConfig) -> dict:
    t0 = time.time()
    ident = identity(cfg)
    check_identity(cfg.output, ident, resuming=bool(part_files(cfg.output)), what="labels")
    init_ray(cfg.ray)

    gpu = use_gpu(cfg.engine.accelerator)
    files = part_files(cfg.input)
    if not files:
        raise SystemExit(f"labels: no traces (part-*.parquet) in {cfg.input}")
    expected = read_column(cfg.input, "id")[: cfg.limit]  # "first N" = in part-file order
    stale = clean_tmp(cfg.output)
    repaired = repair_duplicates(cfg.output)
    check_input_rows(cfg)
    write_identity(cfg.output, ident)
    already = done_ids(cfg.output, retry_errors=cfg.retry_errors)
    todo = [i for i in expected if i not in already]
    log.info(
        "labels: %d input traces, %d already in %s, %d to do (%d stale temp files, %d duplicate rows removed%s); "
        "engine on %s",
        len(expected),
        len(expected) - len(todo),
        cfg.output,
        len(todo),
        stale,
        repaired,
        ", retrying error rows" if cfg.retry_errors else "",
        "GPU" if gpu else "CPU",
    )
    processed, timing, engines = 0, None, 0
    if todo:
        e = cfg.engine
        engines = engine_actors(e.concurrency, gpu, "labels")
        ds = read_parquet(files, columns=COLUMNS)
        ds = ds.map_batches(keep_ids, fn_kwargs={"ids": todo}, batch_format="pyarrow", num_cpus=0.25)
        resources = {"num_gpus": e.tensor_parallel_size} if gpu else {"num_cpus": 1}
        kill_after = int(os.environ.get(KILL_ENGINE_ENV, "0") or 0)
        ds = ds.map_batches(
            ProbeLabeler,
            fn_constructor_kwargs={
                **labeler_kwargs(cfg, gpu),
                "test_kill_engine": (kill_after, os.path.join(cfg.output, KILLED_MARKER)) if kill_after else None,
            },
            concurrency=engines,
            batch_size=e.batch_size,
            batch_format="pyarrow",
            runtime_env={"env_vars": engine_env(e, gpu)},
            max_task_retries=ENGINE_TASK_RETRIES,  # a batch whose engine died runs again on a fresh actor
            **resources,
        )
        res = write_parts(
            ds, folder=cfg.output, schema_name="labels", chunk_rows=cfg.chunk_rows, total=len(todo), stage="labels"
        )
        processed = res["rows"]
        timing = res
    repaired += repair_duplicates(cfg.output)
    # temp files of writers that died mid-write (their node was lost): Ray's retry wrote those rows
    stale += clean_tmp(cfg.output)
    summary = tally(cfg.output, expected)
    secs = time.time() - t0
    summary.update(
        stage="labels",
        output=cfg.output,
        skipped_already_done=len(expected) - len(todo),
        processed_this_run=processed,
        duplicates_removed=repaired,
        stale_tmp_removed=stale,
        seconds=round(secs, 1),
        rows_per_s=round(processed / secs, 3) if secs > 0 else None,
        engines=engines,
    )
    summary["engine_rows_per_s"], summary["engine_busy_s"] = engine_rate(timing)
    failed = error_rate_failure(summary, cfg.max_error_rate)
    if failed:
        summary["failed"] = failed
    return summary
