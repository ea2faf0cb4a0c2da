"""`specexit bench vllm`: EAGLE-3 only vs SpecExit inside vLLM, on the toy test split.

Methods (same teacher, same draft weights, same engine settings):
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
import statistics
import tempfile
import time
from pathlib import Path

from specexit_core.bench.spec_counters import SpecCounters, acceptance_length, attach
from specexit_core.exit import NEVER_FIRES, load_exit_overrides
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from specexit_core.toy.task import grade, problems
from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

log = logging.getLogger("specexit.bench")


def _engine(draft_dir: Path, k: int):
    from vllm import LLM

    return LLM(
        **toy_llm_kwargs(
            str(TEACHER_DIR),
            speculative_config={"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": k},
            disable_log_stats=False,
        )
    )


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
        for m in names[i % len(names) :] + names[: i % len(names)]:
            before = counters[m].snapshot()
            t0 = time.perf_counter()
            outs[m].append(engines[m][0].generate([{"prompt_token_ids": p}], sps[m], use_tqdm=False)[0])
            lat1[m].append(time.perf_counter() - t0)
            after = counters[m].snapshot()
            spec[m][0] += after[0] - before[0]
            spec[m][1] += after[1] - before[1]
    lat16 = {m: [] for m in names}
    for w in range(waves):
        batch = [{"prompt_token_ids": prompts[(w * 16 + i) % len(prompts)]} for i in range(16)]
        for m in names[w % len(names) :] + names[: w % len(names)]:
            t0 = time.perf_counter()
            engines[m][0].generate(batch, sps[m], use_tqdm=False)
            lat16[m].append(time.perf_counter() - t0)
    res = {}
    for m in names:
        close = engines[m][0].get_tokenizer().convert_tokens_to_ids("</think>")
        think = [
            list(o.outputs[0].token_ids).index(close)
            if close in o.outputs[0].token_ids
            else len(o.outputs[0].token_ids)
            for o in outs[m]
        ]
        res[m] = {
            "accuracy": sum(grade(o.outputs[0].text, g) for o, g in zip(outs[m], golds)) / len(golds),
            "think_tokens": statistics.mean(think),
            "latency_s": statistics.mean(lat1[m]),
            "latency_s_c16": statistics.mean(lat16[m]) if lat16[m] else None,
            "tokens": statistics.mean(len(o.outputs[0].token_ids) for o in outs[m]),
            # mean tokens per target step over this method's own requests (engines are shared
            # by two methods, so the counters are read before and after each request)
            "acceptance_length": acceptance_length(*spec[m]),
        }
    return res


def run_bench(n: int = 50, k: int = 3, max_tokens: int = 400, waves: int = 3, exit_config: str | None = None) -> dict:
    """`exit_config`: a calibrated JSON (`specexit calibrate`, {"exit": {...}}) for the `specexit`
    method's requests; None = the draft's defaults (the paper's thresholds for the shipped draft)."""
    apply_cpu_defaults()
    from transformers import AutoTokenizer

    from specexit_core.draft.checkpoint import convert
    from specexit_core.toy.teacher_eval import prompt_ids

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    probs = problems("test", n, seed=1234)
    prompts = [prompt_ids(tok, p) for p in probs]
    golds = [p.answer for p in probs]
    res: dict = {"n": n, "num_speculative_tokens": k}
    spec_args = None
    if exit_config:
        spec_args = {"specexit": load_exit_overrides(Path(exit_config))}
        res["specexit_exit"] = spec_args["specexit"]
    with tempfile.TemporaryDirectory() as tmp:
        stock = _engine(convert(DRAFT_DIR, Path(tmp) / "stock", add_signals=False), k)
        spec = _engine(DRAFT_DIR, k)
        never = {"specexit": dict(NEVER_FIRES)}
        res["methods"] = _measure_all(
            {"eagle3": (stock, None), "specexit_never_fires": (spec, never), "specexit": (spec, spec_args)},
            prompts,
            golds,
            max_tokens,
            waves,
        )
        for llm in (stock, spec):
            llm.llm_engine.engine_core.shutdown()
    e, s, nf = (res["methods"][m] for m in ("eagle3", "specexit", "specexit_never_fires"))
    res["ratios"] = {
        "speedup_c1_specexit_vs_eagle3": e["latency_s"] / s["latency_s"],
        "speedup_c16_specexit_vs_eagle3": (e["latency_s_c16"] / s["latency_s_c16"]) if waves else None,
        "think_tokens_specexit_vs_eagle3": s["think_tokens"] / e["think_tokens"],
        "overhead_never_fires_vs_eagle3_c1": nf["latency_s"] / e["latency_s"] - 1,
        "accuracy_delta_points": 100 * (s["accuracy"] - e["accuracy"]),
    }
    return res


def main(n: int, as_json: bool, exit_config: str | None = None) -> int:
    import os

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout for the report
    res = run_bench(n=n, exit_config=exit_config)
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{'method':22s} {'acc':>6s} {'think':>7s} {'lat c1':>8s} {'lat c16':>8s} {'accept':>7s}")
        for name, m in res["methods"].items():
            acc_len = m.get("acceptance_length")
            print(
                f"{name:22s} {m['accuracy']:6.3f} {m['think_tokens']:7.1f} {m['latency_s']:8.3f} "
                f"{m['latency_s_c16'] or 0:8.3f} {acc_len if acc_len is None else round(acc_len, 2)!s:>7s}"
            )
        for k, v in res["ratios"].items():
            print(f"{k:40s} {v:.3f}" if v is not None else f"{k:40s} -")
    return 0
