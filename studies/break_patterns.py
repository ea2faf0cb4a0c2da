"""What the exit has to find on a teacher's traces: the run of right and wrong forced answers along each
trace's probed breaks, and where a draft's confidence rises against the break where the answer turns right.

    python studies/break_patterns.py LABELS [--target TARGET --draft NAME=DRAFT ...] [--out OUT.json]

LABELS: a labels folder (`python -m pipelines.labels`). Each trace's probe outcomes at its breaks, runs
collapsed ('01': wrong, then right to the end; '010': right, then a slip the trace does not catch), counted.
With drafts, each one's confidence along the same tokens (the target in transformers, teacher-forced: what the
engine records, `signal_ablation.py`), on the '01' traces: the confidence at the last wrong break, at the
first right one and at the one after, and how many breaks after the turn the raw confidence first passes
each threshold (negative: before the answer is right, an exit there loses it), and the text of the step that
ends at each early pass of 0.5 (`early_steps`: what the thinking says where the confidence rises too soon).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipelines.common.parts import read_all  # noqa: E402
from pipelines.common.provenance import emit_result, provenance  # noqa: E402

THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
EARLY_AT = 0.5  # the threshold whose early passes `early_steps` quotes


def pattern(outcomes: list[float]) -> str:
    """The right (1) / wrong (0) runs of a trace's forced answers, each run one character."""
    return re.sub(r"(.)\1+", r"\1", "".join("1" if o > 0.5 else "0" for o in outcomes))


def turn_index(outcomes: list[float]) -> int:
    """The first break from which every forced answer is right (the oracle's break)."""
    i = len(outcomes)
    while i > 0 and outcomes[i - 1] > 0.5:
        i -= 1
    return i


def around_the_turn(traces: list[dict]) -> dict:
    """On '01' traces with at least one wrong break: the confidence around the turn, and the lead or lag
    (in breaks) of the first break whose confidence passes each threshold."""
    before, at, after, lag, early = [], [], [], {t: [] for t in THRESHOLDS}, []
    for tr in traces:
        if pattern(tr["outcomes"]) != "01":
            continue
        conf = [tr["signals"][b][0] for b in tr["boundaries"]]
        k = turn_index(tr["outcomes"])
        before.append(conf[k - 1])
        at.append(conf[k])
        if k + 1 < len(conf):
            after.append(conf[k + 1])
        for t in THRESHOLDS:
            first = next((i for i, c in enumerate(conf) if c > t), None)
            lag[t].append(None if first is None else first - k)
            if t == EARLY_AT and first is not None and first < k and "step_text" in tr:
                early.append({"id": tr["id"], "break": first, "turn": k, "step": tr["step_text"](first)})

    def dist(x: list) -> dict:
        done = [v for v in x if v is not None]
        return {
            "never": len(x) - len(done),
            "early": sum(v < 0 for v in done),
            "at_turn": sum(v == 0 for v in done),
            "late_breaks_mean": float(np.mean([v for v in done if v > 0])) if any(v > 0 for v in done) else 0.0,
            "late": sum(v > 0 for v in done),
        }

    return {
        "traces": len(at),
        "confidence_mean": {
            "last_wrong_break": float(np.mean(before)),
            "first_right_break": float(np.mean(at)),
            "next_break": float(np.mean(after)) if after else None,
        },
        "first_pass_vs_turn": {str(t): dist(v) for t, v in lag.items()},
        "early_steps": early,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("labels")
    ap.add_argument("--draft", action="append", default=[], help="NAME=DRAFT_DIR (repeatable)")
    ap.add_argument("--target")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = sorted((r for r in read_all(a.labels).to_pylist() if r["status"] == "ok"), key=lambda r: r["id"])
    patterns = Counter(pattern(r["probe_outcomes"]) for r in rows)
    res = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "labels": a.labels,
        "traces": len(rows),
        "final_correct": sum(bool(r["final_correct"]) for r in rows),
        "patterns": dict(patterns.most_common()),
    }
    if a.draft:
        import torch
        from signal_ablation import held_out_traces
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from specexit_core.teachers.model_ref import resolve_model

        target = AutoModelForCausalLM.from_pretrained(resolve_model(a.target), dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(resolve_model(a.target))

        def step_text(r: dict):
            def text(i: int) -> str:  # the step that ends at break i, the break included
                lo = r["boundaries"][i - 1] + 1 if i > 0 else r["think_start"]
                return tok.decode(r["completion_token_ids"][lo : r["boundaries"][i] + 1]).strip()

            return text

        res["drafts"] = {}
        for spec in a.draft:
            name, _, path = spec.partition("=")
            traces = held_out_traces(Path(path), target, rows)
            for tr, r in zip(traces, rows):
                tr.update(boundaries=r["boundaries"], outcomes=r["probe_outcomes"], step_text=step_text(r))
            res["drafts"][name] = {"draft": path, "around_the_turn": around_the_turn(traces)}
    res["provenance"] = provenance(" ".join(sys.argv))
    emit_result(res, a.out)


if __name__ == "__main__":
    main()
