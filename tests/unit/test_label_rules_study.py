"""The label-rule studies' own arithmetic: studies/signal_ablation.py's `relabel` (the same probes spread
over the tokens by another rule; `next_step` rebuilds the labels job's arrays exactly) and
studies/break_patterns.py's runs of right and wrong breaks and the confidence around the turn."""

from __future__ import annotations

import numpy as np
import pytest

from specexit_core.labels import confidence_from_probes
from support.paths import load_script


def _row(outcomes, boundaries, n=12, start=0, end=10):
    conf = confidence_from_probes(n, boundaries, outcomes, start, end).tolist()  # the labels job's default
    return {
        "completion_token_ids": list(range(n)),
        "boundaries": boundaries,
        "probe_outcomes": outcomes,
        "think_start": start,
        "think_end": end,
        "confidence": conf,
    }


def test_relabel_rules():
    mod = load_script("studies/signal_ablation.py")
    row = _row([0.0, 1.0, 0.0, 1.0], [2, 4, 6, 8])
    assert mod.relabel([row], "next_step")[0]["confidence"] == row["confidence"]
    same = mod.relabel([row], "same_step")[0]["confidence"]
    # the break that ends a step says what the answer forced there is: tokens 3-4 end at break 4 (right)
    assert same[:3] == [0, 0, 0] and same[3:5] == [1, 1] and same[5:7] == [0, 0] and same[7:10] == [1, 1, 1]
    settled = mod.relabel([row], "settled_same_step")[0]["confidence"]
    assert settled[:7] == [0] * 7 and settled[7:10] == [1, 1, 1]  # break 4 is right but break 6 is not
    nxt = np.asarray(mod.relabel([row], "settled_next_step")[0]["confidence"])
    assert nxt[:9].sum() == 0 and nxt[9] == 1  # the step after the last break, the only settled one
    with pytest.raises(SystemExit, match="confidence_label"):
        mod.relabel([row], "previous_step")


def test_break_patterns_and_the_turn():
    mod = load_script("studies/break_patterns.py")
    assert mod.pattern([0, 0, 1, 1]) == "01" and mod.pattern([1, 0, 0, 1]) == "101" and mod.pattern([]) == ""
    assert mod.turn_index([0, 0, 1, 1]) == 2 and mod.turn_index([1, 1]) == 0 and mod.turn_index([1, 0]) == 2
    signals = [(c, 0.0, 0.0) for c in (0.1, 0.2, 0.3, 0.9, 0.95, 0.4, 0.6)]
    traces = [
        {"signals": signals, "boundaries": [1, 3, 4], "outcomes": [0.0, 1.0, 1.0]},  # passes 0.5 at the turn
        {  # early at 0.5 (break 0, the turn at break 2), never at 0.9
            "id": "e",
            "signals": signals,
            "boundaries": [3, 5, 6],
            "outcomes": [0.0, 0.0, 1.0],
            "step_text": lambda i: f"step {i}",
        },
        {"signals": signals, "boundaries": [1, 2, 3], "outcomes": [1.0, 0.0, 1.0]},  # a slip: not an '01' trace
    ]
    res = mod.around_the_turn(traces)
    assert res["traces"] == 2
    assert res["confidence_mean"]["first_right_break"] == pytest.approx((0.9 + 0.6) / 2)
    assert res["first_pass_vs_turn"]["0.5"] == {
        "never": 0,
        "early": 1,
        "at_turn": 1,
        "late_breaks_mean": 0.0,
        "late": 0,
    }
    assert res["first_pass_vs_turn"]["0.9"]["never"] == 1 and res["first_pass_vs_turn"]["0.9"]["late"] == 1
    assert res["early_steps"] == [{"id": "e", "break": 0, "turn": 2, "step": "step 0"}]


def test_more_traces_join_training_without_the_held_out_or_repeats(tmp_path):
    """The data-size lever: rows of more labels folders join training, each id once, never one that is
    trained on or held out already, never an error row."""
    import pyarrow as pa

    from pipelines.common.parts import write_part
    from pipelines.common.schemas import LABELS, empty_row

    mod = load_script("studies/signal_ablation.py")

    def folder(name, ids, bad=()):
        rows = [dict(empty_row(LABELS, i, ""), status="ok", error=None) for i in ids]
        rows += [dict(empty_row(LABELS, i, ""), status="error", error="x") for i in bad]
        write_part(tmp_path / name, pa.Table.from_pylist(rows, schema=LABELS))
        return str(tmp_path / name)

    a, b = folder("a", ["t1", "h1", "n1", "n2"], bad=["e1"]), folder("b", ["n2", "n3"])
    got = mod.more_training_rows([a, b], {"t1", "h1"})
    assert [r["id"] for r in got] == ["n1", "n2", "n3"]
    assert mod.parse_variant("long=steps: 600, end_weight: 4") == ("long", {"steps": 600, "end_weight": 4})
