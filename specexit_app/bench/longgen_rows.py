"""`specexit bench longgen`'s measurement and rows (the engines and model sets are in `longgen_bench.py`):
every method's runs per prompt, rotated so background load hits them alike, turned into one row per (method,
backend, length, temperature, penalty) with ratios against the plain decoding of the same backend; the issue's
targets checked on the rows; the human table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specexit_app.bench.methods import rotated
from specexit_core.longgen.diversity import distinct_n

LONG_TARGET = 16384  # the targets are stated at 16K generated tokens


# ------------------------------------------------------------------ one run, one row
@dataclass
class RunResult:
    """One method on one prompt."""

    tokens: list[int]
    wall_s: float
    cpu_s: float | None = None  # this process's CPU time (torch runs; vLLM computes in its engine process)
    verify_steps: int = 0  # verification forwards that checked drafts (0: plain)
    drafted: int = 0  # drafted positions
    accepted: int = 0
    drafter_kv_positions: int = 0
    extra: dict = field(default_factory=dict)  # method-specific counters, summed over prompts into the row


Runner = Callable[[list[int], int, float, int, bool], RunResult]  # (prompt, length, temperature, seed, penalty)


class Sweep(Protocol):
    """What `measure` reads of the bench's settings (`LongGenBenchConfig`, longgen_bench.py, is one): the rows'
    grid, the repeats and the seed. A protocol, so this module does not import the bench that imports it."""

    lengths: Sequence[int]
    temperatures: Sequence[float]
    penalties: Sequence[str]
    repeats: int
    seed: int


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def shape_row(
    method: str,
    backend: str,
    length: int,
    temperature: float,
    penalty: str,
    runs: Sequence[RunResult],
    baseline: Sequence[RunResult] | None,
) -> dict:
    """A row of the JSON from one method's runs (one per prompt) and its backend's plain runs (`baseline`;
    ignored for plain itself; None for another method: no ratio, no identity)."""
    wall = sum(r.wall_s for r in runs)
    cpu = sum(r.cpu_s for r in runs) if all(r.cpu_s is not None for r in runs) else None
    steps, drafted, accepted = (sum(getattr(r, k) for r in runs) for k in ("verify_steps", "drafted", "accepted"))
    greedy = temperature == 0.0
    is_plain = method == "plain"
    row = {
        "method": method,
        "backend": backend,
        "length": length,
        "temperature": temperature,
        "penalty": penalty,
        "prompts": len(runs),
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens_per_forward": (steps + accepted) / steps if steps else 1.0,
        "acceptance": accepted / drafted if drafted else None,
        "distinct_n": sum(distinct_n(r.tokens) for r in runs) / len(runs),
        "identical_to_plain": (True if greedy else None) if is_plain else None,
        "drafter_kv_positions": max(r.drafter_kv_positions for r in runs),
        "speedup_vs_plain": 1.0 if is_plain else None,
        "speedup_vs_plain_cpu": (1.0 if cpu is not None else None) if is_plain else None,
        "generated_tokens": sum(len(r.tokens) for r in runs),
    }
    for r in runs:
        for k, v in r.extra.items():
            row[k] = row.get(k, 0) + v
    if is_plain or baseline is None:
        return row
    p_wall = sum(r.wall_s for r in baseline)
    p_cpu = sum(r.cpu_s for r in baseline) if all(r.cpu_s is not None for r in baseline) else None
    row["speedup_vs_plain"] = _ratio(p_wall, wall)
    row["speedup_vs_plain_cpu"] = _ratio(p_cpu, cpu)
    if greedy:
        row["identical_to_plain"] = all(r.tokens == p.tokens for r, p in zip(runs, baseline, strict=True))
    return row


def add_cross_ratios(rows: list[dict]) -> None:
    """`vllm_long` rows: speed-up over EAGLE-3 alone (same length, temperature and penalty), by wall time."""
    by = {(r["method"], r["backend"], r["length"], r["temperature"], r["penalty"]): r for r in rows}
    for r in rows:
        if r["method"] == "vllm_long":
            e = by.get(("eagle3", "vllm", r["length"], r["temperature"], r["penalty"]))
            r["speedup_vs_eagle3"] = _ratio(e["wall_s"], r["wall_s"]) if e else None


def fastest(results: Sequence[RunResult]) -> RunResult:
    return min(results, key=lambda r: r.wall_s)


def measure(
    cfg: Sweep,
    runners: dict[tuple[str, str], Runner],
    prompts: Sequence[list[int]],
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Every (length, temperature, penalty): each prompt through every (method, backend) runner, rotated per
    prompt and repeat; rows in the order of `runners` (plain rows first within a backend)."""
    keys = list(runners)
    rows: list[dict] = []
    turn = 0  # the rotation runs on across rows, so every runner takes every slot
    for length in cfg.lengths:
        for temperature in cfg.temperatures:
            for penalty in cfg.penalties:
                runs: dict[tuple[str, str], list[list[RunResult]]] = {k: [[] for _ in prompts] for k in keys}
                for _ in range(cfg.repeats):
                    for i, p in enumerate(prompts):
                        for k in rotated(keys, turn):
                            runs[k][i].append(runners[k](p, length, temperature, cfg.seed + i, penalty == "on"))
                        turn += 1
                best = {k: [fastest(rs) for rs in runs[k]] for k in keys}
                block = []
                for (method, backend), res in best.items():
                    base = best.get(("plain", backend))
                    block.append(shape_row(method, backend, length, temperature, penalty, res, base))
                tv = (best.get(("plain", "torch")), best.get(("plain", "vllm")))
                if temperature == 0.0 and all(tv):
                    agree = all(a.tokens == b.tokens for a, b in zip(*tv, strict=True))
                    for row in block:
                        if row["method"] == "plain" and row["backend"] == "vllm":
                            row["torch_vllm_plain_agree"] = agree
                add_cross_ratios(block)
                for row in block:
                    if on_row:
                        on_row(row)
                rows += block
    return rows


def targets(rows: list[dict]) -> dict:
    """The issue's targets, checked where the rows reach 16K generated tokens; below that, the value at the
    longest length measured with `pass` null (not measurable there)."""

    def at(method, temperature=0.0, penalty="off"):
        cand = [
            r for r in rows if r["method"] == method and r["temperature"] == temperature and r["penalty"] == penalty
        ]
        return max(cand, key=lambda r: r["length"]) if cand else None

    def check(row, key, want):
        if row is None:
            return {"value": None, "at_length": None, "required": want, "pass": None, "why": "no such row"}
        v, same = row.get(key), row.get("identical_to_plain")
        ok = None if row["length"] < LONG_TARGET or v is None else bool(v >= want and same is not False)
        return {"value": v, "identical": same, "at_length": row["length"], "required": want, "pass": ok}

    out = {
        "tokenswift_speedup_vs_plain_greedy_16k": check(at("tokenswift"), "speedup_vs_plain", 2.5),
        "vllm_long_speedup_vs_eagle3_greedy_16k": check(at("vllm_long"), "speedup_vs_eagle3", 1.3),
    }
    pen = [r for r in rows if r["penalty"] == "on"]
    if pen:
        longest = max(r["length"] for r in pen)
        worst = min((r for r in pen if r["length"] == longest), key=lambda r: r["distinct_n"])
        out["distinct_n_penalty_on"] = {
            "value": worst["distinct_n"],
            "method": worst["method"],
            "at_length": longest,
            "required": 0.4,
            "pass": worst["distinct_n"] >= 0.4,
        }
    return out


# ------------------------------------------------------------------ the table
def print_table(rows: list[dict], skipped: dict[str, str], print_fn=print) -> None:
    print_fn(
        f"{'length':>6} {'T':>4} {'pen':>3} {'method':>10} {'backend':>7} {'wall_s':>8} {'speedup':>8} "
        f"{'tok/fwd':>7} {'accept':>6} {'dist-n':>6} {'kv':>5} {'identical':>9}"
    )
    for r in rows:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        sp = "-" if r["speedup_vs_plain"] is None else f"{r['speedup_vs_plain']:.2f}x"
        same = {True: "yes", False: "NO", None: "-"}[r["identical_to_plain"]]
        print_fn(
            f"{r['length']:>6} {r['temperature']:>4g} {r['penalty']:>3} {r['method']:>10} {r['backend']:>7} "
            f"{r['wall_s']:8.2f} {sp:>8} {r['tokens_per_forward']:7.2f} {acc:>6} {r['distinct_n']:6.2f} "
            f"{r['drafter_kv_positions']:5d} {same:>9}"
        )
    for m, why in skipped.items():
        print_fn(f"{m}: skipped ({why})")
