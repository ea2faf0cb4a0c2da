"""Prefix-cache and preemption counters of one engine replica: in `specexit_stats()["prefix_cache"]` and
as Ray metrics (tags `model`, `replica`) that Ray's metrics agent exports to Prometheus.

The numbers are the ones vLLM's scheduler already sends with every engine step (`SchedulerStats`,
`IterationStats`, vllm/v1/metrics/stats.py), counted as vLLM's own Prometheus logger counts them:
* `queries` / `hits`: prompt tokens of newly scheduled requests looked up in / found in the engine's
  prefix cache (`prefix_cache_stats`; a preempted request's second lookup is not counted again);
* `external_queries` / `external_hits`: the same through a KV connector (host memory, disk, LMCache,
  ...: `connector_prefix_cache_stats`; 0 without a connector);
* `preemptions`: requests the scheduler preempted to free KV blocks (`num_preempted_reqs`).

Why a small stat logger added to the engine's own logger manager (specexit_core/vllm_stats.py,
as the benchmarks do for an offline engine) and not Ray Serve LLM's `log_engine_metrics=True`: that option swaps vLLM's
Prometheus logger for Ray's wrapper of it (`RayPrometheusStatLogger`: every vLLM metric, on every
deployment), and serve_app/app.py keeps it off; this leaves that choice as it is. The counters here come
from the statistics the engine computes anyway (`disable_log_stats` is False by default), in the
replica's own process: nothing runs in the engine core or the workers, so it is the same on the CPU and
GPU builds.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from specexit_core import vllm_stats

log = logging.getLogger("specexit.serve.cache_metrics")

# Ray metric name -> (CacheCounts field, description). Prometheus sees `ray_<name>` (Ray's prefix).
METRICS: dict[str, tuple[str, str]] = {
    "specexit_prefix_cache_queries": ("queries", "prompt tokens looked up in the engine's prefix cache"),
    "specexit_prefix_cache_hits": ("hits", "prompt tokens found in the engine's prefix cache"),
    "specexit_external_prefix_cache_queries": ("external_queries", "prompt tokens looked up through the KV connector"),
    "specexit_external_prefix_cache_hits": ("external_hits", "prompt tokens the KV connector supplied"),
    "specexit_preemptions": ("preemptions", "requests the scheduler preempted to free KV cache blocks"),
}
TAG_KEYS = ("model", "replica")


@dataclass
class CacheCounts:
    """Cumulative since the engine started."""

    queries: int = 0
    hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    preemptions: int = 0


class CountSink(Protocol):
    def add(self, field: str, value: int) -> None: ...


class RayCounters:
    """One Ray Counter per field, tagged with the model and the replica."""

    def __init__(self, model: str, replica: str):
        from ray.util.metrics import Counter

        self._tags = {"model": model, "replica": replica}
        self._counters = {
            field: Counter(name, description=desc, tag_keys=TAG_KEYS) for name, (field, desc) in METRICS.items()
        }

    def add(self, field: str, value: int) -> None:
        self._counters[field].inc(value, tags=self._tags)  # Ray refuses an increment of 0


class CacheStatLogger(vllm_stats.AttachedStatLogger):
    """A vLLM stat logger that counts into CacheCounts and forwards each increment to a sink."""

    def __init__(self, sink: CountSink | None = None):
        self.counts = CacheCounts()
        self._sink = sink

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        delta: dict[str, int] = {}
        if scheduler_stats is not None:
            local = scheduler_stats.prefix_cache_stats
            delta["queries"], delta["hits"] = local.queries, local.hits
            external = scheduler_stats.connector_prefix_cache_stats
            if external is not None:
                delta["external_queries"], delta["external_hits"] = external.queries, external.hits
        if iteration_stats is not None:
            delta["preemptions"] = iteration_stats.num_preempted_reqs
        for field, value in delta.items():
            if value > 0:
                setattr(self.counts, field, getattr(self.counts, field) + value)
                if self._sink is not None:
                    try:
                        self._sink.add(field, value)
                    except Exception:  # noqa: BLE001 -- metrics are never fatal to the engine's output loop
                        log.exception("exporting %s failed", field)

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self.counts)


def attach(engine_client: Any, sink: CountSink | None) -> CacheStatLogger | None:
    """Add a CacheStatLogger to a started AsyncLLM's logger manager; None when the engine keeps no
    statistics (`disable_log_stats: true`: the scheduler then computes none)."""
    if vllm_stats.logger_manager(engine_client) is None:
        log.warning("the engine keeps no statistics (disable_log_stats): no prefix-cache or preemption counters")
        return None
    return vllm_stats.attach(engine_client, CacheStatLogger(sink))
