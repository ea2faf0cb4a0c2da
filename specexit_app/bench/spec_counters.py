"""Speculative-decoding counters of one vLLM engine (offline `LLM`), read between requests: the
per-step `SpecDecodingStats` the scheduler sends with every output batch, counted by a stat logger of
that engine alone (specexit_core/vllm_stats.py says why not Prometheus).
"""

from __future__ import annotations

from specexit_core import vllm_stats


class SpecCounters(vllm_stats.AttachedStatLogger):
    """Cumulative (drafts, draft tokens, accepted tokens) of one engine."""

    def __init__(self) -> None:
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        sd = getattr(scheduler_stats, "spec_decoding_stats", None) if scheduler_stats is not None else None
        if sd is not None:
            self.drafts += sd.num_drafts
            self.draft_tokens += sd.num_draft_tokens
            self.accepted += sd.num_accepted_tokens

    def snapshot(self) -> tuple[int, int]:
        return self.drafts, self.accepted


def attach(llm) -> SpecCounters:
    """Attach counters to an offline `vllm.LLM` (built with disable_log_stats=False)."""
    return vllm_stats.attach(llm, SpecCounters())


def acceptance_length(drafts: float, accepted: float) -> float | None:
    """Mean tokens per target step over steps that verified drafts: 1 (bonus/correction) + accepted."""
    return 1.0 + accepted / drafts if drafts else None
