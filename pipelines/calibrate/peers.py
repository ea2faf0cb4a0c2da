"""The peers' settings chosen on the dev split, by the same rule as SpecExit's (issue 17, item 2).

Every method with a knob gets the same dev problems, the same accuracy tolerance and the same choice:
the fewest mean think tokens with accuracy >= EAGLE-3's - tolerance (`rules.best_setting`), and a
choice at an end of its grid is reported.

- DEER (threshold x mean): at greedy, DEER follows the EAGLE-3 trace until it exits, so one trial
  answer (its confidence) and one forced answer (right or not) at each transition word of each dev
  trace decide every setting (`deer_points`, probed by the evaluation worker).
- Dynasor (probe interval x window): likewise, one probe at every think token decides every interval
  that is a multiple of the probing stride (`dynasor_points`). The paper probes every 32-64 tokens of
  traces thousands long (~1% of a trace); `paper_every` gives that granularity on these traces, and the
  grid contains it.
- Budget: likewise, one forced answer after `</think>` at each budget below each trace's length
  (`budget_points`): what the engine's `max_think_tokens` does at greedy.

`reference_dynasor_exit` is Dynasor's decision as Snowflake's arctic-inference implements it
(`arctic_inference/dynasor/cot.py`, re-stated here, not copied): a probe is sent *before* each chunk
(positions 0, c, 2c, ...), the check runs after the chunk is generated, hedges are matched as
substrings of the lower-cased probe text, and the answer is the probe's. Its probes sample at
T = 0.6 / top-p 0.95; here both rules read the same greedy probes, so the cross-check isolates the
decision rule. `cross_check` compares it with ours on the same traces.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence

from pipelines.evaluate.rules import best_setting, dynasor_should_exit

# Dynasor's paper: a probe every 32-64 tokens (we take 32) of R1 traces of ~3,500 tokens on MATH500.
PAPER_PROBE_SHARE = 32 / 3500


def paper_every(mean_think_tokens: float) -> int:
    """Dynasor's probe interval at its paper's granularity relative to trace length (>= 1 token)."""
    return max(1, round(PAPER_PROBE_SHARE * mean_think_tokens))


def deer_exit(points: Sequence[Sequence], threshold: float, mean: str) -> tuple[int, bool] | None:
    """(think tokens, forced answer right) at DEER's first exit along one trace; None: no exit."""
    col = {"arithmetic": 1, "geometric": 2}[mean]
    for p in points:
        if p[col] > threshold:
            return int(p[0]), bool(p[3])
    return None


def dynasor_exit(
    points: dict[int, Sequence], end: int, every: int, window: int, hedge_words: Iterable[str]
) -> tuple[int, bool] | None:
    """Our Dynasor (`methods.dynasor`): after each chunk of `every` tokens, a probe at its end; exit
    when the last `window` answers agree and none hedges (whole words). None: thinking ended first."""
    answers, texts = [], []
    for p in range(every, end + 1, every):
        pt = points[p]
        answers.append(pt[1])
        texts.append(pt[2])
        if dynasor_should_exit(answers, texts, window=window, hedge_words=hedge_words):
            return p, bool(pt[3])
    return None


def reference_dynasor_exit(
    points: dict[int, Sequence], end: int, every: int, window: int, hedge_words: Iterable[str]
) -> tuple[int, bool] | None:
    """arctic-inference's Dynasor-CoT decision on the same probes: the probe at i*every is sent with
    chunk i; after the chunk (at (i+1)*every) the last `window` probe answers must be equal and
    non-empty and no probe text may contain a hedge word as a substring; the answer is the last probe's."""
    words = [w.lower() for w in hedge_words]
    answers, texts = [], []
    for i in itertools.count():
        at, after = i * every, (i + 1) * every
        if after > end:  # thinking is over within this chunk: no early exit
            return None
        pt = points[at]
        answers.append(pt[1] or "")
        texts.append(pt[2])
        last, last_texts = answers[-window:], texts[-window:]
        certain = [not any(w in t.lower() for w in words) for t in last_texts]
        if len(last) == window and len(set(last)) == 1 and all(a != "" for a in last) and all(certain):
            return after, bool(pt[3])


def replay(traces: list[dict], decide) -> dict:
    """Accuracy and mean think tokens when `decide(trace) -> (think, right) | None` exits (None: the
    full trace, its own answer)."""
    acc, think = [], []
    for tr in traces:
        d = decide(tr)
        if d is None:
            acc.append(tr["correct"])
            think.append(tr["think_tokens"])
        else:
            think.append(d[0])
            acc.append(d[1])
    return {"accuracy": statistics.mean(acc), "think_tokens": statistics.mean(think)}


# Where a grid cannot go further: a probe every token, two answers that agree.
FLOORS = {"every": 1, "window": 2}


def _edges(grid: dict[str, list], chosen: dict) -> list[str]:
    out = []
    for name, values in grid.items():
        v = chosen[name]
        if v == FLOORS.get(name):
            continue
        if len(values) > 1 and isinstance(v, (int, float)) and v in (min(values), max(values)):
            end = "lowest" if v == min(values) else "highest"
            out.append(f"{name} = {v:g} is the {end} value of the grid {sorted(values)}")
    return out


def choose(points: list[dict], grid: dict[str, list], *, ref_accuracy: float, tolerance: float) -> dict:
    """The cheapest setting within tolerance, its replayed figures, the grid and its edges."""
    best = best_setting(points, ref_accuracy=ref_accuracy, tolerance=tolerance)
    setting = {k: best[k] for k in grid}
    return {
        "setting": setting,
        "replay": {"accuracy": best["accuracy"], "think_tokens": best["think_tokens"]},
        "within_tolerance": best["accuracy"] >= ref_accuracy - tolerance - 1e-12,
        "grid_size": len(points),
        "grid": grid,
        "at_grid_edge": _edges(grid, setting),
    }


def calibrate_deer(traces, thresholds, means, *, ref_accuracy, tolerance) -> dict:
    pts = [
        {"threshold": t, "mean": m, **replay(traces, lambda tr, t=t, m=m: deer_exit(tr["deer_points"], t, m))}
        for t, m in itertools.product(thresholds, means)
    ]
    out = choose(
        pts, {"threshold": list(thresholds), "mean": list(means)}, ref_accuracy=ref_accuracy, tolerance=tolerance
    )
    s = out["setting"]
    with_points = [tr for tr in traces if tr["deer_points"]]
    first = [deer_exit(tr["deer_points"], s["threshold"], s["mean"]) for tr in with_points]
    out["exits_at_first_word_share"] = (
        sum(d is not None and d[0] == tr["deer_points"][0][0] for d, tr in zip(first, with_points)) / len(with_points)
        if with_points
        else None
    )
    if out["exits_at_first_word_share"] == 1.0:  # no lower threshold can exit any earlier
        out["at_grid_edge"] = [e for e in out["at_grid_edge"] if not e.startswith("threshold")]
    return out


def calibrate_dynasor(traces, everys, windows, hedge_words, *, ref_accuracy, tolerance) -> dict:
    def ours(e, w):
        return lambda tr: dynasor_exit(tr["dynasor_points"], tr["think_end"], e, w, hedge_words)

    pts = [{"every": e, "window": w, **replay(traces, ours(e, w))} for e, w in itertools.product(everys, windows)]
    out = choose(pts, {"every": list(everys), "window": list(windows)}, ref_accuracy=ref_accuracy, tolerance=tolerance)
    mean_think = statistics.mean(tr["think_tokens"] for tr in traces)
    out["paper_every"] = paper_every(mean_think)
    out["paper_every_how"] = (
        f"{PAPER_PROBE_SHARE * 100:.2f}% of the mean dev trace ({mean_think:.1f} think tokens): "
        "the paper's 32 tokens of ~3,500"
    )
    out["cross_check"] = cross_check(traces, out["setting"]["every"], out["setting"]["window"], hedge_words)
    return out


def cross_check(traces: list[dict], every: int, window: int, hedge_words) -> dict:
    """Our Dynasor vs the reference implementation's decision rule on the same traces and probes:
    how often they exit at the same point with the same answer, and each one's replayed figures."""
    same = 0
    for tr in traces:
        a = dynasor_exit(tr["dynasor_points"], tr["think_end"], every, window, hedge_words)
        b = reference_dynasor_exit(tr["dynasor_points"], tr["think_end"], every, window, hedge_words)
        # the reference exits one chunk after its deciding probe: compare the deciding probes
        same += (a is None and b is None) or (a is not None and b is not None and (b[0] - every, b[1]) == a)
    ref = replay(
        traces, lambda tr: reference_dynasor_exit(tr["dynasor_points"], tr["think_end"], every, window, hedge_words)
    )
    ours = replay(traces, lambda tr: dynasor_exit(tr["dynasor_points"], tr["think_end"], every, window, hedge_words))
    return {
        "every": every,
        "window": window,
        # both decide on the same probe (or both never exit); the reference then exits `every` later
        "same_decision_share": same / len(traces) if traces else math.nan,
        "ours": ours,
        "reference_rule": ref,
        "differences": "reference: probe sent before each chunk (exit one chunk later, on an older probe), "
        "hedge words matched as substrings, probes sampled at T=0.6 (here: the same greedy probes for both)",
    }


def budget_exit(points: dict[int, bool], budget: int) -> tuple[int, bool] | None:
    """(think tokens, answer right) when `</think>` is forced after `budget` think tokens; None: the
    trace thinks no longer than that (probed budgets are those below its think tokens)."""
    return (budget, bool(points[budget])) if budget in points else None


def calibrate_budget(traces: list[dict], budgets: list[int], *, ref_accuracy: float, tolerance: float) -> dict:
    """The cheapest static thinking budget within tolerance, replayed from `budget_points`."""
    pts = [{"budget": b, **replay(traces, lambda tr, b=b: budget_exit(tr["budget_points"], b))} for b in budgets]
    return choose(pts, {"budget": sorted(budgets)}, ref_accuracy=ref_accuracy, tolerance=tolerance)
