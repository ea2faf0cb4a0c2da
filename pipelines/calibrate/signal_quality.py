"""How good the exit signals are, measured directly on a calibration (or evaluation) run's traces.

The exit can only be as good as its signals. On the traces of a dev or test run (the eagle3 rows with
their per-token signals, joined with the oracle's probes at every paragraph break: `load_traces`):

- **confidence** against the label it is trained on, at every probed break: is the answer forced there
  right? AUROC (how well it ranks right breaks above wrong ones; 0.5 = chance), the Brier score, and a
  reliability table (mean confidence against the fraction right, per confidence bin).
- **progress** and **remaining** against their truth at every think token (the training labels' own rule,
  `specexit_core.labels.progress_remaining`): mean absolute error overall and by position in the thinking
  (fifths of the true progress), remaining both in tokens and in log1p (the scale it is regressed on).
- **the best exit the signals allow**: every setting of the calibration grid replayed over the traces;
  the Pareto front of mean think tokens against accuracy, beside EAGLE-3 (no exit) and the evaluation's
  oracle (the earliest break after which every forced answer is right).

`specexit signals DEV_DIR --draft DRAFT [--config CALIBRATE_YAML] [--temperature T] [--out JSON]` prints it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

from specexit_core.labels import find_think_span, progress_remaining
from specexit_core.training.signal_quality import auroc as training_auroc

POSITION_BUCKETS = 5  # fifths of the thinking (by true progress)
RELIABILITY_BINS = 10


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (the Mann-Whitney statistic, ties counted half); None without both classes.
    The training's held-out metric computes it (`specexit_core.training.signal_quality.auroc`, nan there)."""
    value = training_auroc(scores, np.asarray(labels, bool))
    return None if math.isnan(value) else value


def reliability(scores: Sequence[float], labels: Sequence[bool], bins: int = RELIABILITY_BINS) -> list[dict]:
    """Per equal-width confidence bin that holds any break: its range, count, mean confidence and the
    fraction of its breaks whose forced answer is right (a calibrated signal has the two equal)."""
    s, y = np.asarray(scores, float), np.asarray(labels, float)
    idx = np.minimum((s * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        m = idx == b
        if m.any():
            out.append(
                {
                    "bin": [b / bins, (b + 1) / bins],
                    "n": int(m.sum()),
                    "mean_confidence": float(s[m].mean()),
                    "fraction_right": float(y[m].mean()),
                }
            )
    return out


def _think_span(trace: dict, token_ids: dict) -> tuple[int, int] | None:
    completion = trace["completion"]
    opened_by_prompt = completion[:1] != [token_ids["think_start"]]  # Qwen3 writes <think> itself
    return find_think_span(
        completion,
        think_start_id=token_ids["think_start"],
        think_end_id=token_ids["think_end"],
        prompt_opened_think=opened_by_prompt,
    )


def confidence_quality(traces: list[dict]) -> dict:
    """Confidence at every probed break against the forced answer's correctness."""
    conf, right = [], []
    for tr in traces:
        for idx, ok in tr["probes"].items():
            if 0 <= idx < len(tr["signals"]):
                conf.append(tr["signals"][idx][0])
                right.append(bool(ok))
    return {
        "breaks": len(conf),
        "right": int(sum(right)),
        "auroc": auroc(conf, right),
        "brier": float(np.mean((np.asarray(conf) - np.asarray(right, float)) ** 2)) if conf else None,
        "reliability": reliability(conf, right) if conf else [],
    }


def regression_quality(traces: list[dict], token_ids: dict) -> dict:
    """Progress and remaining against their truth at every think token of every closed trace."""
    rows = []  # (true progress, progress error, remaining error in tokens, in log1p)
    for tr in traces:
        span = _think_span(tr, token_ids)
        if span is None:
            continue
        progress, remaining, _ = progress_remaining(len(tr["completion"]), *span)
        for i in range(*span):
            _, p, r = tr["signals"][i]
            rows.append(
                (
                    float(progress[i]),
                    abs(p - float(progress[i])),
                    abs(r - float(remaining[i])),
                    abs(np.log1p(max(r, 0.0)) - np.log1p(float(remaining[i]))),
                )
            )
    if not rows:
        return {"tokens": 0, "progress": None, "remaining": None}
    a = np.asarray(rows)
    bucket = np.minimum(((a[:, 0] - 1e-9) * POSITION_BUCKETS).astype(int), POSITION_BUCKETS - 1)
    by_position = [
        {
            "progress": [b / POSITION_BUCKETS, (b + 1) / POSITION_BUCKETS],
            "tokens": int((bucket == b).sum()),
            "progress_mae": float(a[bucket == b, 1].mean()),
            "remaining_mae_tokens": float(a[bucket == b, 2].mean()),
            "remaining_mae_log1p": float(a[bucket == b, 3].mean()),
        }
        for b in range(POSITION_BUCKETS)
        if (bucket == b).any()
    ]
    return {
        "tokens": len(rows),
        "progress_mae": float(a[:, 1].mean()),
        "remaining_mae_tokens": float(a[:, 2].mean()),
        "remaining_mae_log1p": float(a[:, 3].mean()),
        "by_position": by_position,
    }


def pareto_front(points: list[dict]) -> list[dict]:
    """The settings no other beats on both think tokens (fewer) and accuracy (higher), by think tokens."""
    front, best = [], -1.0
    for p in sorted(points, key=lambda p: (p["think_tokens"], -p["accuracy"])):
        if p["accuracy"] > best + 1e-12:
            front.append(p)
            best = p["accuracy"]
    return front


def oracle_outcome(trace: dict, token_ids: dict) -> tuple[bool, int]:
    """The evaluation's oracle exit (`pipelines.evaluate.rules.oracle_cut`: the earliest break after
    which every forced answer is right, on a trace whose own answer is right) replayed on the trace,
    its think tokens counted by the exit tracker as the grid's settings are; else the trace as it is."""
    from pipelines.calibrate.job import trace_checks
    from pipelines.evaluate.rules import oracle_cut

    comp = trace["completion"]
    if token_ids["think_end"] not in comp:
        return bool(trace["correct"]), trace["think_tokens"]
    breaks = sorted(trace["probes"])
    cut = oracle_cut(
        breaks, [bool(trace["probes"][b]) for b in breaks], bool(trace["correct"]), comp.index(token_ids["think_end"])
    )
    for check in trace_checks(trace, 1.0, token_ids):
        if cut is not None and check.index == cut - 1:
            return True, check.think_tokens
    return bool(trace["correct"]), trace["think_tokens"]


def exit_headroom(traces: list[dict], points: list[dict], token_ids: dict) -> dict:
    """The replayed grid's front beside EAGLE-3 (no exit) and the oracle exit on the same traces."""
    oracle = [oracle_outcome(t, token_ids) for t in traces]
    return {
        "eagle3": {
            "accuracy": statistics.mean(bool(t["correct"]) for t in traces),
            "think_tokens": statistics.mean(t["think_tokens"] for t in traces),
        },
        "oracle": {
            "accuracy": statistics.mean(ok for ok, _ in oracle),
            "think_tokens": statistics.mean(n for _, n in oracle),
        },
        "settings": len(points),
        "front": pareto_front(points),
    }


def measure(eval_dir: str, draft: str, *, config: str | None = None, temperatures: Sequence[float] = (0.0,)) -> dict:
    """Everything above for the traces of the run in `eval_dir` at each temperature: `draft` gives the
    token ids (think markers, breaks), `config` (a CalibrateConfig recipe, default the toy's) the grid."""
    from pipelines.calibrate.config import CalibrateConfig
    from pipelines.calibrate.job import draft_token_ids, grid, load_traces, replay
    from specexit_core.typed_config import load_config

    token_ids = draft_token_ids(draft)
    cfg = load_config(CalibrateConfig, config or "examples/toy/calibrate.yaml", what="calibrate")
    settings = grid(cfg)
    from pipelines.common.provenance import provenance

    out: dict = {"eval_dir": eval_dir, "draft": draft, "by_temperature": {}, "provenance": provenance()}
    for t in temperatures:
        traces = load_traces(eval_dir, t)
        if not traces:
            raise ValueError(f"{eval_dir}: no eagle3 + oracle traces at temperature {t:g}")
        out["by_temperature"][f"{t:g}"] = {
            "traces": len(traces),
            "confidence": confidence_quality(traces),
            "regression": regression_quality(traces, token_ids),
            "headroom": exit_headroom(traces, replay(traces, settings, token_ids), token_ids),
        }
    return out
