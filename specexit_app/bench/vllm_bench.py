"""`specexit bench vllm`: EAGLE-3 only vs SpecExit inside vLLM, on the toy test split.

Methods (same teacher, same draft weights, same engine settings; names, rows and ratios shared
with `specexit bench reference` in bench/methods.py):
  eagle3               stock EAGLE-3 engine (the draft converted to a stock checkpoint: no hook at all)
  specexit             SpecExit engine, default exit thresholds
  specexit_never_fires SpecExit engine, thresholds that cannot pass: the cost of the machinery
Latency: concurrency 1 = one request at a time (mean seconds per request); concurrency 16 = waves
of 16 requests submitted together (mean wall seconds per wave). Methods run interleaved, prompt
by prompt, so background load hits them alike. Absolute times are noisy on
shared CPUs; compare the ratios, which come from one run.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from specexit_app.bench.methods import METHODS, method_row, print_table, ratios, rotated, toy_prompts
from specexit_app.bench.spec_counters import SpecCounters, acceptance_length, attach
from specexit_core.draft.checkpoint import convert
from specexit_core.exit import NEVER_FIRES, load_exit_overrides
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

log = logging.getLogger("specexit.bench")
WAVE = 16  # requests submitted together for the concurrency-16 latency


def engine_kwargs(draft_dir: Path, k: int) -> dict:
    """The bench's engine arguments (stats on: the per-engine acceptance counters need them)."""
    return toy_llm_kwargs(
        str(TEACHER_DIR),
        speculative_config={"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": k},
        disable_log_stats=False,
    )


def _engine(draft_dir: Path, k: int):
    from vllm import LLM

    return LLM(**engine_kwargs(draft_dir, k))


@contextmanager
def engine_pair(k: int):
    """(stock EAGLE-3 engine, SpecExit engine) on the shipped draft, shut down on exit. One place
    for the pair, so a test can hand in engines it already runs (same `engine_kwargs`)."""
    with tempfile.TemporaryDirectory() as tmp:
        stock = _engine(convert(DRAFT_DIR, Path(tmp) / "stock", add_signals=False), k)
        spec = _engine(DRAFT_DIR, k)
        try:
            yield stock, spec
        finally:
            for llm in (stock, spec):
                llm.llm_engine.engine_core.shutdown()


def _measure_all(engines: dict, prompts, golds, max_tokens: int, waves: int) -> dict:
    """Interleaved: for every prompt (and every wave of 16), each method runs back to back in a
    rotating order, so background load on a shared machine hits all methods alike."""
    from vllm import SamplingParams

    names = list(engines)
    by_engine: dict[int, SpecCounters] = {}
    for m in names:
        if id(engines[m][0]) not in by_engine:
            by_engine[id(engines[m][0])] = attach(engines[m][0])
    counters = {m: by_engine[id(engines[m][0])] for m in names}
    sps = {m: SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=engines[m][1]) for m in names}
    for m in names:  # warm-up
        engines[m][0].generate([{"prompt_token_ids": prompts[0]}], sps[m], use_tqdm=False)
    lat1 = {m: [] for m in names}
    outs = {m: [] for m in names}
    spec = {m: [0.0, 0.0] for m in names}  # this method's (drafts, accepted tokens), c1 runs only
    for i, p in enumerate(prompts):
        for m in rotated(names, i):
            before = counters[m].snapshot()
            t0 = time.perf_counter()
            outs[m].append(engines[m][0].generate([{"prompt_token_ids": p}], sps[m], use_tqdm=False)[0])
            lat1[m].append(time.perf_counter() - t0)
            after = counters[m].snapshot()
            spec[m][0] += after[0] - before[0]
            spec[m][1] += after[1] - before[1]
    lat16 = {m: [] for m in names}
    for w in range(waves):
        batch = [{"prompt_token_ids": prompts[(w * WAVE + i) % len(prompts)]} for i in range(WAVE)]
        for m in rotated(names, w):
            t0 = time.perf_counter()
            engines[m][0].generate(batch, sps[m], use_tqdm=False)
            lat16[m].append(time.perf_counter() - t0)
    res = {}
    for m in names:
        close = engines[m][0].get_tokenizer().convert_tokens_to_ids("</think>")
        ids = [list(o.outputs[0].token_ids) for o in outs[m]]
        res[m] = method_row(
            texts=[o.outputs[0].text for o in outs[m]],
            golds=golds,
            think_tokens=[t.index(close) if close in t else len(t) for t in ids],
            tokens=[len(t) for t in ids],
            latencies_c1=lat1[m],
            latencies_c16=lat16[m],
            # engines are shared by two methods, so the counters are read before and after each request
            acceptance_length=acceptance_length(*spec[m]),
        )
    return res


def bench_engines(
    stock, spec, prompts, golds, *, k: int = 3, max_tokens: int = 400, waves: int = 3, exit_config: str | None = None
) -> dict:
    """Every method on engines the caller owns (a stock EAGLE-3 `LLM` and a SpecExit `LLM`, both
    built with `engine_kwargs`): the bench's JSON document."""
    res: dict = {"n": len(prompts), "num_speculative_tokens": k}
    spec_args = None
    if exit_config:
        spec_args = {"specexit": load_exit_overrides(exit_config)}
        res["specexit_exit"] = spec_args["specexit"]
    never = {"specexit": dict(NEVER_FIRES)}
    by_name = {"eagle3": (stock, None), "specexit_never_fires": (spec, never), "specexit": (spec, spec_args)}
    res["methods"] = _measure_all({m: by_name[m] for m in METHODS}, prompts, golds, max_tokens, waves)
    res["ratios"] = ratios(res["methods"])
    return res


def run_bench(n: int = 50, k: int = 3, max_tokens: int = 400, waves: int = 3, exit_config: str | None = None) -> dict:
    """`exit_config`: a calibrated JSON (`specexit calibrate`, {"exit": {...}}) for the `specexit`
    method's requests; None = the draft's defaults (the paper's thresholds for the shipped draft)."""
    apply_cpu_defaults()
    from transformers import AutoTokenizer

    prompts, golds = toy_prompts(AutoTokenizer.from_pretrained(str(TEACHER_DIR)), n)
    with engine_pair(k) as (stock, spec):
        return bench_engines(
            stock, spec, prompts, golds, k=k, max_tokens=max_tokens, waves=waves, exit_config=exit_config
        )


def main(n: int, as_json: bool, exit_config: str | None = None) -> int:
    import os

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout for the report
    res = run_bench(n=n, exit_config=exit_config)
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0
