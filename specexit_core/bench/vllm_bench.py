"""`specexit bench vllm`: EAGLE-3 only vs SpecExit inside vLLM, on the toy test split.

Methods (same teacher, same draft weights, same engine settings):
  eagle3               stock EAGLE-3 engine (the draft converted to a stock checkpoint: no hook at all)
  specexit             SpecExit engine, default exit thresholds
  specexit_never_fires SpecExit engine, thresholds that cannot pass: the cost of the machinery
Latency: concurrency 1 = one request at a time (mean seconds per request); concurrency 16 = waves
of 16 requests submitted together (mean wall seconds per wave). Absolute times are noisy on
shared CPUs; compare the ratios, which come from one run.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from ..toy.paths import DRAFT_DIR, TEACHER_DIR
from ..toy.task import grade, problems
from ..vllm_env import apply_cpu_defaults, toy_llm_kwargs

log = logging.getLogger("specexit.bench")
NEVER = {"specexit_method": "confidence", "specexit_confidence_threshold": 1.0}


def _engine(draft_dir: Path, k: int):
    from vllm import LLM

    return LLM(**toy_llm_kwargs(str(TEACHER_DIR), speculative_config={
        "method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": k}))


def _measure(llm, prompts, golds, extra_args, max_tokens: int, waves: int) -> dict:
    from vllm import SamplingParams

    tok = llm.get_tokenizer()
    close = tok.convert_tokens_to_ids("</think>")
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=extra_args)
    llm.generate([{"prompt_token_ids": prompts[0]}], sp, use_tqdm=False)  # warm-up
    lat1, outs = [], []
    for p in prompts:
        t0 = time.perf_counter()
        outs.append(llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0])
        lat1.append(time.perf_counter() - t0)
    lat16 = []
    for w in range(waves):
        batch = [prompts[(w * 16 + i) % len(prompts)] for i in range(16)]
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in batch], sp, use_tqdm=False)
        lat16.append(time.perf_counter() - t0)
    think, acc, accept = [], [], []
    for o, g in zip(outs, golds):
        c = o.outputs[0]
        ids = list(c.token_ids)
        think.append(ids.index(close) if close in ids else len(ids))
        acc.append(grade(c.text, g))
        m = getattr(o, "metrics", None)
    return {
        "accuracy": sum(acc) / len(acc),
        "think_tokens": statistics.mean(think),
        "latency_s": statistics.mean(lat1),
        "latency_s_c16": statistics.mean(lat16) if lat16 else None,
        "tokens": statistics.mean(len(o.outputs[0].token_ids) for o in outs),
    }


def _acceptance(llm) -> float | None:
    """Mean accepted length (tokens per target step) from vLLM's spec-decode counters."""
    try:
        from vllm.v1.metrics.reader import Counter, Vector

        m = {x.name: x for x in llm.get_metrics()}
        drafts = m["vllm:spec_decode_num_drafts"].value
        accepted = m["vllm:spec_decode_num_accepted_tokens"].value
        return 1 + accepted / drafts if drafts else None
    except Exception:  # metrics API differs across versions: report what we can
        return None


def run_bench(n: int = 50, k: int = 3, max_tokens: int = 400, waves: int = 3) -> dict:
    apply_cpu_defaults()
    from ..draft.checkpoint import convert
    from ..toy.evaluate import prompt_ids
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    probs = problems("test", n, seed=1234)
    prompts = [prompt_ids(tok, p) for p in probs]
    golds = [p.answer for p in probs]
    res: dict = {"n": n, "num_speculative_tokens": k, "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        stock = convert(DRAFT_DIR, Path(tmp) / "stock", add_signals=False)
        llm = _engine(stock, k)
        res["methods"]["eagle3"] = _measure(llm, prompts, golds, None, max_tokens, waves)
        res["methods"]["eagle3"]["acceptance_length"] = _acceptance(llm)
        llm.llm_engine.engine_core.shutdown()
        del llm
    llm = _engine(DRAFT_DIR, k)
    res["methods"]["specexit_never_fires"] = _measure(llm, prompts, golds, NEVER, max_tokens, waves)
    before = _acceptance(llm)
    res["methods"]["specexit"] = _measure(llm, prompts, golds, None, max_tokens, waves)
    res["methods"]["specexit"]["acceptance_length"] = _acceptance(llm)  # cumulative over both runs
    res["methods"]["specexit_never_fires"]["acceptance_length"] = before
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


def main(n: int, as_json: bool) -> int:
    res = run_bench(n=n)
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{'method':22s} {'acc':>6s} {'think':>7s} {'lat c1':>8s} {'lat c16':>8s} {'accept':>7s}")
        for name, m in res["methods"].items():
            acc_len = m.get("acceptance_length")
            print(f"{name:22s} {m['accuracy']:6.3f} {m['think_tokens']:7.1f} {m['latency_s']:8.3f} "
                  f"{m['latency_s_c16'] or 0:8.3f} {acc_len if acc_len is None else round(acc_len, 2)!s:>7s}")
        for k, v in res["ratios"].items():
            print(f"{k:40s} {v:.3f}" if v is not None else f"{k:40s} -")
    return 0
