"""What `specexit bench vllm` and `specexit bench reference` share: the method names, the
interleaving order, one method's row, the ratios, and the text table.

Both benches compare the same three methods on the same teacher and draft weights:
  eagle3               stock EAGLE-3 (the draft converted to a stock checkpoint: no exit machinery)
  specexit_never_fires SpecExit, thresholds that cannot pass: the cost of the machinery
  specexit             SpecExit, the draft's default exit thresholds (or a calibrated file)
so their JSON has the same keys; only the engine differs. Pure Python (no vLLM; torch only through the tokenizer's prompt helper).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from specexit_core.toy.task import grade, problems

METHODS = ("eagle3", "specexit_never_fires", "specexit")


def toy_prompts(tok, n: int) -> tuple[list[list[int]], list[int]]:
    """The benches' problems: the first n of the toy test split (fixed seed), as prompt ids and answers."""
    from specexit_core.toy.teacher_eval import prompt_ids

    probs = problems("test", n, seed=1234)
    return [prompt_ids(tok, p) for p in probs], [p.answer for p in probs]


def rotated(names: Sequence[str], i: int) -> list[str]:
    """The order the methods run in for prompt (or wave) i: rotated by one each time, so
    background load on a shared machine and warm caches hit every method alike."""
    s = i % len(names) if names else 0
    return list(names[s:]) + list(names[:s])


def method_row(
    texts: Sequence[str],
    golds: Sequence[int],
    think_tokens: Sequence[int],
    tokens: Sequence[int],
    latencies_c1: Sequence[float],
    latencies_c16: Sequence[float],
    acceptance_length: float | None,
) -> dict:
    """One method's figures over the prompts (every key both benches report)."""
    return {
        "accuracy": sum(grade(t, g) for t, g in zip(texts, golds, strict=True)) / len(golds),
        "think_tokens": statistics.mean(think_tokens),
        "latency_s": statistics.mean(latencies_c1),
        "latency_s_c16": statistics.mean(latencies_c16) if latencies_c16 else None,
        "tokens": statistics.mean(tokens),
        # mean tokens per target step over steps that verified drafts (1 + accepted drafts)
        "acceptance_length": acceptance_length,
    }


def ratios(methods: dict) -> dict:
    """SpecExit against EAGLE-3 from one run's rows (c16 ratio None when no waves ran)."""
    e, s, nf = (methods[m] for m in ("eagle3", "specexit", "specexit_never_fires"))
    c16 = e["latency_s_c16"] is not None and s["latency_s_c16"] is not None
    return {
        "speedup_c1_specexit_vs_eagle3": e["latency_s"] / s["latency_s"],
        "speedup_c16_specexit_vs_eagle3": e["latency_s_c16"] / s["latency_s_c16"] if c16 else None,
        "think_tokens_specexit_vs_eagle3": s["think_tokens"] / e["think_tokens"],
        "overhead_never_fires_vs_eagle3_c1": nf["latency_s"] / e["latency_s"] - 1,
        "accuracy_delta_points": 100 * (s["accuracy"] - e["accuracy"]),
    }


def print_table(res: dict) -> None:
    """The human-readable form of a bench result (`--json` prints the dict instead)."""
    print(f"{'method':22s} {'acc':>6s} {'think':>7s} {'lat c1':>8s} {'lat c16':>8s} {'accept':>7s}")
    for name, m in res["methods"].items():
        acc_len = m.get("acceptance_length")
        print(
            f"{name:22s} {m['accuracy']:6.3f} {m['think_tokens']:7.1f} {m['latency_s']:8.3f} "
            f"{m['latency_s_c16'] or 0:8.3f} {acc_len if acc_len is None else round(acc_len, 2)!s:>7s}"
        )
    for k, v in res["ratios"].items():
        print(f"{k:40s} {v:.3f}" if v is not None else f"{k:40s} -")
