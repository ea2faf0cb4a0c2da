"""`python -m pipelines.traces --config FILE`: teacher reasoning traces with vLLM via ray.data.llm.

prompts (toy / JSONL / Parquet / HF) -> skip ids already written -> chat template -> tokenize (ours,
`chat_prompt`: no special tokens added to the template's text) -> vLLM (`vLLMEngineProcessorConfig` +
`build_processor`) -> split reasoning / answer -> Parquet parts
(schema: pipelines/common/schemas.py TRACES). Invalid prompts never reach the engine; prompts the engine
rejects (e.g. longer than the context) come back as error rows (`should_continue_on_error`).
"""

from __future__ import annotations

import functools
import logging
import time

from pipelines.common.error_rows import error_rate_failure
from pipelines.common.parts import clean_tmp, done_ids, part_files, read_all, repair_duplicates, tally, write_part
from pipelines.common.prompt_source import read_prompts
from pipelines.common.run_identity import (
    changed_rows,
    check_identity,
    config_identity,
    model_fingerprint,
    refuse_changed_rows,
    write_identity,
)
from pipelines.common.runtime import engine_actors, engine_env, engine_placement, init_ray, stable_seed, use_gpu
from pipelines.common.schemas import TRACES, empty_row, to_table
from pipelines.common.tokens import load_tokenizer, think_opened, token_ids
from pipelines.common.writer import engine_rate, write_parts
from pipelines.traces.config import TracesConfig

log = logging.getLogger("specexit.pipelines.traces")


def chat_prompt(tok, messages: list[dict], chat_template_kwargs: dict | None = None) -> tuple[str, list[int]]:
    """The generation prompt's text and token ids, as a chat endpoint (vLLM's, Serve's) and the
    evaluation build them: the chat template's text, tokenized without adding special tokens. Ray
    Data's own tokenize stage adds them, so a template that writes its BOS itself (Llama 3, the
    DeepSeek-R1 distills: `<｜begin▁of▁sentence｜><｜User｜>...`) got a second BOS; Qwen3's and the
    toy's templates add none, their ids are the same either way."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {}))
    return text, tok.encode(text, add_special_tokens=False)


@functools.lru_cache(maxsize=2)
def _worker_tokenizer(model: str):  # once per Ray Data worker process
    return load_tokenizer(model)


def build_trace_processor(cfg: TracesConfig, gpu: bool, engines: int | None = None):
    """Ray Data LLM's processor for the traces: `engines` engine actors (None: the config's)."""
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    e = cfg.engine
    proc_cfg = vLLMEngineProcessorConfig(
        model_source=e.model,
        engine_kwargs=e.engine_kwargs(),
        batch_size=e.batch_size,
        concurrency=engines or e.concurrency,
        runtime_env={"env_vars": engine_env(e, gpu)},
        should_continue_on_error=True,  # one bad prompt must not fail the job
        chat_template_stage=False,  # `preprocess` renders and tokenizes the prompt (`chat_prompt`)
        tokenize_stage=False,
        detokenize_stage=False,  # vLLM already returns the text
        log_engine_metrics=False,
        **engine_placement(e, gpu),
    )
    s = cfg.sampling
    system = cfg.system_prompt
    model, template_kwargs = e.model, dict(cfg.chat_template_kwargs)

    def preprocess(row: dict) -> dict:
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": row["input_prompt"]}
        ]
        sp = dict(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens)
        if s.top_k is not None:
            sp["top_k"] = s.top_k
        if s.seed is not None and s.temperature > 0:
            sp["seed"] = stable_seed(s.seed, row["id"])
        text, ids = chat_prompt(_worker_tokenizer(model), msgs, template_kwargs)
        return dict(prompt=text, tokenized_prompt=ids, sampling_params=sp)

    return build_processor(proc_cfg, preprocess=preprocess, postprocess=lambda row: row)


def finalize(row: dict, *, ids: dict, think_start_text: str, think_end_text: str) -> dict:
    """Engine output row (or error row) -> one TRACES row."""
    base = dict(id=row["id"], prompt=row.get("input_prompt"), gold=row.get("gold"))
    err = row.get("__inference_error__") or ""
    if err:
        return empty_row(TRACES, row["id"], f"engine: {err}", prompt=base["prompt"], gold=base["gold"])
    prompt_ids = [int(t) for t in row["prompt_token_ids"]]
    comp = [int(t) for t in row["generated_tokens"]]
    text = row["generated_text"] or ""
    finish = "length"
    while comp and comp[-1] in ids["eos"]:
        comp.pop()
        finish = "stop"
    # Did the chat template open the think segment (Qwen3-Thinking, R1-distill) or must the model?
    opened = think_opened(prompt_ids, ids["think_start"], ids["think_end"])
    head = text
    if not opened and think_start_text in head:
        head = head.split(think_start_text, 1)[1]
    closed = ids["think_end"] in comp
    reasoning, answer = head.split(think_end_text, 1) if think_end_text in head else (head, "")
    m = row.get("metrics") or {}
    t0 = m.get("arrival_time")  # wall clock; the other stamps are engine-core monotonic
    t1 = t0 + max(0.0, m.get("last_token_ts", 0.0) - m.get("queued_ts", 0.0)) if t0 else None
    return dict(
        base,
        _t0=t0,
        _t1=t1,
        status="ok",
        error=None,
        prompt_token_ids=prompt_ids,
        completion_token_ids=comp,
        completion_text=text,
        reasoning=reasoning.strip("\n"),
        answer=answer.strip(),
        finished_think=closed,
        finish_reason=finish,
        num_prompt_tokens=len(prompt_ids),
        num_completion_tokens=len(comp),
    )


def identity(cfg: TracesConfig) -> dict:
    """What the rows depend on (pipelines/common/run_identity.py); the input rows are checked id by
    id (`check_input_rows`), so `input.path` and the toy `input.n` may change between runs."""
    return {
        "stage": "traces",
        "config": config_identity(cfg, cfg.RUN_ONLY_KEYS | {"input.path", "input.n"}),
        "models": {"engine.model": model_fingerprint(cfg.engine.model)},
    }


def check_input_rows(cfg: TracesConfig, rows: list[dict]) -> None:
    """Every id already written must still have the prompt and gold it was written from."""
    if not part_files(cfg.output):
        return
    t = read_all(cfg.output, ["id", "prompt", "gold"])
    written = {i: (p, g) for i, p, g in zip(*(t.column(c).to_pylist() for c in ("id", "prompt", "gold")))}
    changed = changed_rows(written, {r["id"]: (r["prompt"], r["gold"]) for r in rows})
    refuse_changed_rows(
        "traces",
        cfg.output,
        changed,
        "Ids without an id column are positions (row-<index>): inserting or removing input lines shifts "
        "them. Give the input an id column (input.id_column) or use a new output folder.",
    )


def run(cfg: TracesConfig) -> dict:
    t0 = time.time()
    ident = identity(cfg)
    check_identity(cfg.output, ident, resuming=bool(part_files(cfg.output)), what="traces")
    init_ray(cfg.ray)
    import ray

    gpu = use_gpu(cfg.engine.accelerator)
    rows = read_prompts(cfg.input, cfg.limit)
    expected = [r["id"] for r in rows]
    stale = clean_tmp(cfg.output)
    repaired = repair_duplicates(cfg.output)
    check_input_rows(cfg, rows)
    write_identity(cfg.output, ident)
    already = done_ids(cfg.output, retry_errors=cfg.retry_errors)
    todo = [r for r in rows if r["id"] not in already]
    log.info(
        "traces: %d input rows, %d already in %s, %d to do (%d stale temp files, %d duplicate rows removed%s); "
        "engine on %s",
        len(rows),
        len(rows) - len(todo),
        cfg.output,
        len(todo),
        stale,
        repaired,
        ", retrying error rows" if cfg.retry_errors else "",
        "GPU" if gpu else "CPU",
    )

    bad = [r for r in todo if r["error"] is not None]
    for i in range(0, len(bad), cfg.chunk_rows):  # invalid rows never reach the engine
        chunk = bad[i : i + cfg.chunk_rows]
        write_part(
            cfg.output,
            to_table(
                [empty_row(TRACES, r["id"], r["error"], prompt=r["prompt"], gold=r["gold"]) for r in chunk], TRACES
            ),
        )
    good = [{"id": r["id"], "input_prompt": r["prompt"], "gold": r["gold"]} for r in todo if r["error"] is None]
    written = {"rows": len(bad)}
    if good:
        # the tokenizer only where there is work: loading it imports transformers and torch (~5 s), the most
        # of a resubmitted finished job's time
        tids = token_ids(
            load_tokenizer(cfg.engine.model),
            think_start=cfg.think_start,
            think_end=cfg.think_end,
            split_tokens=[],  # splits: labels' job
            model_dir=cfg.engine.model,
        )
        ds = ray.data.from_items(good, override_num_blocks=max(1, min(len(good) // cfg.chunk_rows, 200)))
        ds = build_trace_processor(cfg, gpu, engine_actors(cfg.engine.concurrency, gpu, "traces"))(ds)
        ds = ds.map(
            finalize,
            fn_kwargs=dict(
                ids={"eos": set(tids.eos), "think_start": tids.think_start, "think_end": tids.think_end},
                think_start_text=cfg.think_start,
                think_end_text=cfg.think_end,
            ),
            num_cpus=0.25,
        )
        res = write_parts(
            ds, folder=cfg.output, schema_name="traces", chunk_rows=cfg.chunk_rows, total=len(good), stage="traces"
        )
        written["rows"] += res["rows"]
        written["timing"] = res
    repaired += repair_duplicates(cfg.output)
    # temp files of writers that died mid-write (their node was lost): Ray's retry wrote those rows
    stale += clean_tmp(cfg.output)
    summary = tally(cfg.output, expected)
    secs = time.time() - t0
    summary.update(
        stage="traces",
        output=cfg.output,
        skipped_already_done=len(rows) - len(todo),
        processed_this_run=written["rows"],
        duplicates_removed=repaired,
        stale_tmp_removed=stale,
        seconds=round(secs, 1),
        rows_per_s=round(written["rows"] / secs, 3) if secs > 0 else None,
    )
    summary["engine_rows_per_s"], summary["engine_busy_s"] = engine_rate(written.get("timing"))
    failed = error_rate_failure(summary, cfg.max_error_rate)
    if failed:
        summary["failed"] = failed
    return summary
