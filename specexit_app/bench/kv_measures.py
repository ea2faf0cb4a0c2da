"""The pure parts of `specexit bench kv`: KV block-seconds from per-step token counts, the
concurrency sweep, and the result's JSON shape (its key names are a public interface).

No vLLM here: the engine side (bench/step_trace.py, bench/kv_bench.py) hands in plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

RESTART_KEYS = ("hit_share", "prefill_tokens_ratio", "ttft_ratio", "identical")
PRESSURE_KEYS = ("concurrent_without_preemption", "preemptions", "kv_block_seconds_per_request")
PRESSURE_METHODS = ("eagle3", "specexit")

# One engine step's outputs: (its timestamp, {request id: prompt + generated tokens after the step}).
Step = tuple[float, Mapping[str, int]]


def blocks_held(tokens: int, block_size: int) -> int:
    """KV blocks a request holds with `tokens` tokens (prompt + generated) in the cache."""
    return math.ceil(tokens / block_size)


def block_seconds(steps: Sequence[Step], start: float, block_size: int) -> dict[str, float]:
    """Per request: the integral over time of the KV blocks it holds.

    vLLM allocates a step's blocks when it schedules the step, before the forward, so during step
    i (from the previous step's timestamp, or `start` for the first, to its own) a request that
    produced output in it holds the blocks of its token count *after* the step. A request absent
    from a step (waiting, or preempted and not yet resumed) holds nothing during it.
    """
    out: dict[str, float] = {}
    prev = start
    for t, tokens in steps:
        dt = max(0.0, t - prev)
        for rid, n in tokens.items():
            out[rid] = out.get(rid, 0.0) + blocks_held(n, block_size) * dt
        prev = t
    return out


def block_steps(steps: Sequence[Step], block_size: int) -> dict[str, int]:
    """Per request: blocks held summed over the engine steps it ran in (the time-free form of
    `block_seconds`: not moved by other load on a shared machine)."""
    out: dict[str, int] = {}
    for _, tokens in steps:
        for rid, n in tokens.items():
            out[rid] = out.get(rid, 0) + blocks_held(n, block_size)
    return out


def usage_block_seconds(samples: Sequence[tuple[float, float]], start: float, num_blocks: int) -> float:
    """The engine's own view: the integral of its reported KV usage (fraction of blocks in use after
    each step, right-endpoint like `block_seconds`) times the pool size. A cross-check of the sum
    of `block_seconds` over all requests."""
    total, prev = 0.0, start
    for t, usage in samples:
        total += usage * num_blocks * max(0.0, t - prev)
        prev = t
    return total


def largest_without_preemption(run: Callable[[int], int], n_max: int) -> tuple[int, list[dict]]:
    """The largest concurrency n such that every concurrency 1..n ran without a preemption.

    `run(n)` submits n requests at once and returns the preemptions counted. The sweep is linear
    from 1 and stops at the first n that preempts (more requests only add KV demand, but a linear
    sweep does not rely on that), so its cost is the answer plus one wave. Returns (n, the sweep's
    rows); n == n_max means the limit was not reached.
    """
    rows: list[dict] = []
    for n in range(1, n_max + 1):
        p = run(n)
        rows.append({"concurrency": n, "preemptions": p})
        if p > 0:
            return n - 1, rows
    return n_max, rows


def ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def kv_result(restart: Mapping, pressure: Mapping[str, Mapping], **extra) -> dict:
    """The bench's JSON document; refuses a document missing a public key."""
    missing = [f"restart.{k}" for k in RESTART_KEYS if k not in restart]
    for m in PRESSURE_METHODS:
        if m not in pressure:
            missing.append(f"pressure.{m}")
            continue
        missing += [f"pressure.{m}.{k}" for k in PRESSURE_KEYS if k not in pressure[m]]
    if missing:
        raise ValueError(f"kv bench result lacks {', '.join(missing)}")
    return {"restart": dict(restart), "pressure": {m: dict(v) for m, v in pressure.items()}, **extra}
