"""Speculative-decoding counters of one vLLM engine (offline `LLM`), read between requests.

Why not `LLM.get_metrics()`: it reads the process-wide Prometheus registry, and a second engine in
the same process replaces the first one's collectors, so two engines (EAGLE-3 vs SpecExit) cannot
be told apart. This attaches a tiny stat logger to one engine's own logger manager instead; it
sees the per-step `SpecDecodingStats` the scheduler sends with every output batch.
Needs the engine built with `disable_log_stats=False`.
"""

from __future__ import annotations


class SpecCounters:
    """Cumulative (drafts, draft tokens, accepted tokens) of one engine."""

    def __init__(self) -> None:
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0

    # the StatLoggerManager interface (only `record` matters; the others are no-ops)
    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        sd = getattr(scheduler_stats, "spec_decoding_stats", None) if scheduler_stats is not None else None
        if sd is not None:
            self.drafts += sd.num_drafts
            self.draft_tokens += sd.num_draft_tokens
            self.accepted += sd.num_accepted_tokens

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, *args, **kwargs) -> None:
        pass

    def snapshot(self) -> tuple[int, int]:
        return self.drafts, self.accepted


def attach(llm) -> SpecCounters:
    """Attach counters to an offline `vllm.LLM` (built with disable_log_stats=False)."""
    manager = getattr(llm.llm_engine, "logger_manager", None)
    if manager is None:
        raise RuntimeError("the engine keeps no stats: build it with disable_log_stats=False")
    counters = SpecCounters()
    manager.stat_loggers.append(counters)
    return counters


def acceptance_length(drafts: float, accepted: float) -> float | None:
    """Mean tokens per target step over steps that verified drafts: 1 (bonus/correction) + accepted."""
    return 1.0 + accepted / drafts if drafts else None
