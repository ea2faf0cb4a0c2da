"""Several samples of one problem (`EvalConfig.samples`): how a row says which sample it is.

A row of sample 0, the only one at T = 0, is what a one-sample run writes (its `info` says nothing
about samples, its id names none); a further sample's `info` holds `{"sample": j}` and its id
`<problem>/T<t>/s<j>/<method>`. Whatever compares methods pairs rows by `(problem id, sample)`;
whatever certifies or resamples takes the problem as the unit (its samples are not independent).
"""

from __future__ import annotations

import json


def sample_info(sample: int) -> dict:
    """What a row's `info` says about its sample: nothing for sample 0, else its index."""
    return {"sample": sample} if sample else {}


def sample_key(row: dict) -> tuple[str, int]:
    """A row's `(problem id, sample)` (needs its `problem_id` and `info` columns)."""
    return row["problem_id"], int(json.loads(row["info"] or "{}").get("sample", 0))
