"""Engine-level SpecExit counters in vLLM's Prometheus metrics.

The exit runs in the worker process while `/metrics` is served by the API-server process, so the
counters use prometheus_client's multiprocess mode: export `PROMETHEUS_MULTIPROC_DIR` (an empty
folder) before starting vLLM and the API server's `/metrics` aggregates them with vLLM's own
(`vllm:spec_decode_*` already carries the acceptance length). Without it the counters still exist
per worker (`collective_rpc("specexit_counters")`).
"""

from __future__ import annotations

import os


class SpecExitMetrics:
    def __init__(self):
        self.enabled = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        if not self.enabled:
            return
        from prometheus_client import Counter

        self.requests = Counter("specexit_requests", "Requests seen by the SpecExit hook", ["exit_enabled"])
        self.exits = Counter("specexit_exits", "Thinking segments ended early by SpecExit", ["reason"])
        self.think_tokens = Counter("specexit_think_tokens", "Think tokens of finished requests")
        self.exit_think_tokens = Counter("specexit_exit_think_tokens", "Think tokens at the exit point")

    def request(self, exit_enabled: bool) -> None:
        if self.enabled:
            self.requests.labels(exit_enabled=str(bool(exit_enabled)).lower()).inc()

    def exit(self, reason: str, think_tokens: int) -> None:
        if self.enabled:
            self.exits.labels(reason=reason).inc()
            self.exit_think_tokens.inc(think_tokens)

    def finished(self, think_tokens: int) -> None:
        if self.enabled and think_tokens:
            self.think_tokens.inc(think_tokens)
