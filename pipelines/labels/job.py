"""`python -m pipelines.labels --config FILE`: per-token SpecExit labels from teacher traces.

traces Parquet -> skip ids already written -> ProbeLabeler actors (vLLM, prefix caching): at every
step boundary of the think segment cut the trace, force `</think>` + answer prompt, decode a short
greedy answer, grade it -> `specexit_core.labels.label_trace` arrays -> Parquet parts (schema:
pipelines/common/schemas.py LABELS). Trace error rows and unfinished traces become error rows here.
"""

from __future__ import annotations

import logging
import time

from pipelines.common.parts import clean_tmp, done_ids, keep_ids, part_files, read_column, tally
from pipelines.common.runtime import engine_env, init_ray, use_gpu
from pipelines.common.writer import engine_rate, write_parts
from pipelines.labels.config import LabelsConfig
from pipelines.labels.labeler import ProbeLabeler

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
        think_start=cfg.think_start,
        think_end=cfg.think_end,
        split_tokens=cfg.split_tokens,
        shift=cfg.shift,
        initial=cfg.initial_confidence,
        gpu=gpu,
    )


def run(cfg: LabelsConfig) -> dict:
    t0 = time.time()
    init_ray(cfg.ray)
    import ray

    gpu = use_gpu(cfg.engine.accelerator)
    files = part_files(cfg.input)
    if not files:
        raise SystemExit(f"labels: no traces (part-*.parquet) in {cfg.input}")
    expected = read_column(cfg.input, "id")[: cfg.limit]  # "first N" = in part-file order
    stale = clean_tmp(cfg.output)
    already = done_ids(cfg.output)
    todo = [i for i in expected if i not in already]
    log.info(
        "labels: %d input traces, %d already in %s, %d to do (%d stale temp files removed); engine on %s",
        len(expected),
        len(expected) - len(todo),
        cfg.output,
        len(todo),
        stale,
        "GPU" if gpu else "CPU",
    )
    processed, timing = 0, None
    if todo:
        e = cfg.engine
        ds = ray.data.read_parquet([str(f) for f in files], columns=COLUMNS)
        ds = ds.map_batches(keep_ids, fn_kwargs={"ids": todo}, batch_format="pyarrow", num_cpus=0.25)
        resources = {"num_gpus": e.tensor_parallel_size} if gpu else {"num_cpus": 1}
        ds = ds.map_batches(
            ProbeLabeler,
            fn_constructor_kwargs=labeler_kwargs(cfg, gpu),
            concurrency=e.concurrency,
            batch_size=e.batch_size,
            batch_format="pyarrow",
            runtime_env={"env_vars": engine_env(e, gpu)},
            **resources,
        )
        res = write_parts(
            ds, folder=cfg.output, schema_name="labels", chunk_rows=cfg.chunk_rows, total=len(todo), stage="labels"
        )
        processed = res["rows"]
        timing = res
    summary = tally(cfg.output, expected)
    secs = time.time() - t0
    summary.update(
        stage="labels",
        output=cfg.output,
        skipped_already_done=len(expected) - len(todo),
        processed_this_run=processed,
        seconds=round(secs, 1),
        rows_per_s=round(processed / secs, 3) if secs > 0 else None,
        engines=cfg.engine.concurrency,
    )
    summary["engine_rows_per_s"], summary["engine_busy_s"] = engine_rate(timing)
    return summary
