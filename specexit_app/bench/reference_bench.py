"""`specexit bench reference`: the `specexit bench vllm` comparison on the reference PyTorch engine.

Same methods, same toy test problems, same teacher and draft weights, same JSON keys as the vLLM
bench (bench/methods.py); the engine is `specexit_core/engine/reference.py` (transformers target, chain
speculative decoding, the exit), so the figures say what the algorithm itself saves, free of
vLLM's scheduling. Differences that follow from that engine:
  * it serves one request at a time, so there is no concurrency-16 figure: `latency_s_c16` and
    `speedup_c16_specexit_vs_eagle3` are null;
  * `tokens` counts the EOS token like vLLM does (the engine itself drops it from `token_ids`);
  * `acceptance_length` = 1 + accepted / drafting rounds (rounds after a forced `</think>` feed two
    tokens and draft nothing; vLLM's counters skip such steps too).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from specexit_app.bench.methods import METHODS, method_row, print_table, ratios, rotated, toy_prompts
from specexit_app.bench.spec_counters import acceptance_length
from specexit_core.engine.types import GenerationRequest, GenerationResult
from specexit_core.exit import NEVER_FIRES, ExitConfig, load_exit_overrides, resolve_exit_config
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR


def generated_tokens(r: GenerationResult) -> int:
    """Generated tokens as vLLM counts them (EOS included)."""
    return len(r.token_ids) + (r.finish_reason == "stop")


def measure(engines: dict, prompts: list[list[int]], golds: list[int], max_tokens: int) -> dict:
    """`engines`: method name -> (engine, ExitConfig or None for the engine's own). Interleaved
    like the vLLM bench: every prompt runs under every method back to back, in a rotating order."""
    names = list(engines)
    lat = {m: [] for m in names}
    outs: dict[str, list[GenerationResult]] = {m: [] for m in names}
    for m in names:  # warm-up (first-call allocations), as in the vLLM bench
        eng, cfg = engines[m]
        eng.generate([GenerationRequest(prompts[0], max_tokens=max_tokens, exit=cfg)])
    for i, p in enumerate(prompts):
        for m in rotated(names, i):
            eng, cfg = engines[m]
            t0 = time.perf_counter()
            outs[m].append(eng.generate([GenerationRequest(p, max_tokens=max_tokens, exit=cfg)])[0])
            lat[m].append(time.perf_counter() - t0)
    res = {}
    for m in names:
        k = engines[m][0].k
        drafted = sum(r.stats.drafted for r in outs[m])
        res[m] = method_row(
            texts=[r.text for r in outs[m]],
            golds=golds,
            think_tokens=[r.think_tokens for r in outs[m]],
            tokens=[generated_tokens(r) for r in outs[m]],
            latencies_c1=lat[m],
            latencies_c16=[],
            acceptance_length=acceptance_length(drafted / k if k else 0, sum(r.stats.accepted for r in outs[m])),
        )
    return res


def method_exit_configs(draft_defaults: dict | None, exit_config: str | None) -> dict[str, ExitConfig]:
    """The exit setting of each SpecExit method, resolved the way the vLLM plugin resolves it
    (paper defaults <- the draft's `exit_defaults` <- the request's overrides)."""
    overrides = load_exit_overrides(exit_config) if exit_config else None
    return {
        "specexit_never_fires": resolve_exit_config(draft_defaults, request=NEVER_FIRES),
        "specexit": resolve_exit_config(draft_defaults, request=overrides),
    }


def run_bench(n: int = 50, k: int = 3, max_tokens: int = 400, exit_config: str | None = None) -> dict:
    """`exit_config`: as in `specexit bench vllm` (a calibrated JSON for the `specexit` method)."""
    from specexit_core.draft.checkpoint import convert, load_draft
    from specexit_core.engine.reference import ReferenceEngine
    from specexit_core.toy.hf_generate import load_teacher

    model, tok = load_teacher(TEACHER_DIR)
    prompts, golds = toy_prompts(tok, n)
    draft = load_draft(DRAFT_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        stock_draft = load_draft(convert(DRAFT_DIR, Path(tmp) / "stock", add_signals=False))
    res: dict = {"n": n, "num_speculative_tokens": k}
    cfgs = method_exit_configs(draft.cfg.exit_defaults, exit_config)
    if exit_config:
        res["specexit_exit"] = load_exit_overrides(exit_config)
    stock = ReferenceEngine(model, tok, stock_draft, num_speculative_tokens=k)
    spec = ReferenceEngine(model, tok, draft, num_speculative_tokens=k)
    by_name = {"eagle3": (stock, None), **{m: (spec, c) for m, c in cfgs.items()}}
    res["methods"] = measure({m: by_name[m] for m in METHODS}, prompts, golds, max_tokens)
    res["ratios"] = ratios(res["methods"])
    return res


def main(n: int, as_json: bool, exit_config: str | None = None) -> int:
    res = run_bench(n=n, exit_config=exit_config)
    if as_json:
        print(json.dumps(res))  # one line: the last line of stdout
    else:
        print_table(res)
    return 0
