"""Drive an offline vLLM engine step by step and record what a KV bench needs: every request's
token count after every engine step (for block-seconds), its time to first token, its prefix-cache
hits, and the engine's own per-step stats (preemptions, KV usage).

Why not `LLM.generate`: it asks for final outputs only, so the per-step growth of each request is
lost. This adds the requests to the engine with delta outputs and runs the step loop itself (as
`LLM.generate` does). Engine statistics come from a stat logger of this engine alone
(specexit_core/vllm_stats.py), so the engine must be built with `disable_log_stats=False`. Times are this
process's `time.monotonic()` when an engine step's outputs arrive.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from specexit_app.bench.kv_measures import Step
from specexit_core import vllm_stats

_ids = itertools.count()


class EngineCounters(vllm_stats.AttachedStatLogger):
    """A stat logger: preemptions (vLLM's iteration stats) and KV usage after each step (its
    scheduler stats), cumulative over the engine's life; `mark()` / `since()` read a window."""

    def __init__(self) -> None:
        self.preemptions = 0
        self.usage: list[tuple[float, float]] = []  # (time, fraction of KV blocks in use)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if iteration_stats is not None:
            self.preemptions += iteration_stats.num_preempted_reqs
        if scheduler_stats is not None:
            self.usage.append((time.monotonic(), scheduler_stats.kv_cache_usage))


def attach_counters(llm) -> EngineCounters:
    """Attach counters to an offline `vllm.LLM` (built with disable_log_stats=False)."""
    return vllm_stats.attach(llm, EngineCounters())


@dataclass
class RequestTrace:
    prompt_len: int
    submitted: float
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    first_token: float | None = None
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.submitted


@dataclass
class RunTrace:
    """One batch of requests submitted together, run to completion."""

    start: float
    end: float
    requests: list[RequestTrace]
    steps: list[Step]  # request index (as str) -> prompt + generated tokens, per engine step
    preemptions: int  # counted by the engine's iteration stats during the run
    usage: list[tuple[float, float]]  # the engine's KV usage after each step during the run


def run_requests(llm, prompts: list[list[int]], params, counters: EngineCounters | None = None) -> RunTrace:
    """Submit `prompts` at once (SamplingParams `params`, one for all) and step the engine until all
    finish. Request keys in `steps` are the prompts' indices as strings."""
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    if engine.has_unfinished_requests():
        raise RuntimeError("the engine still runs other requests: their KV would be counted as this run's")
    sp = params.clone()
    sp.output_kind = RequestOutputKind.DELTA
    tag = f"kvb{next(_ids)}-"
    p0 = counters.preemptions if counters else 0
    u0 = len(counters.usage) if counters else 0
    start = time.monotonic()
    reqs = []
    index: dict[str, int] = {}  # outputs name the id we gave; vLLM's internal one adds a suffix
    for i, p in enumerate(prompts):
        reqs.append(RequestTrace(prompt_len=len(p), submitted=time.monotonic()))
        index[f"{tag}{i}"] = i
        index[engine.add_request(f"{tag}{i}", {"prompt_token_ids": p}, sp)] = i
    steps: list[Step] = []
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.monotonic()
        counts = {}
        for o in outs:
            i = index[o.request_id]
            r = reqs[i]
            c = o.outputs[0]
            if c.token_ids and r.first_token is None:
                r.first_token = now
            r.token_ids += list(c.token_ids)
            r.text += c.text
            if o.num_cached_tokens is not None:
                r.num_cached_tokens = o.num_cached_tokens
            if o.finished:
                r.finish_reason = c.finish_reason
                if o.metrics is not None:
                    r.num_preemptions = o.metrics.num_preemptions
            counts[str(i)] = r.prompt_len + len(r.token_ids)
        if counts:
            steps.append((now, counts))
    return RunTrace(
        start=start,
        end=time.monotonic(),
        requests=reqs,
        steps=steps,
        preemptions=(counters.preemptions - p0) if counters else sum(r.num_preemptions for r in reqs),
        usage=counters.usage[u0:] if counters else [],
    )
