"""One evaluation output row (the columns `pipelines.evaluate.job.aggregate` reads), for unit tests of
the aggregation, the intervals and the peers' calibration."""

from __future__ import annotations

import json


def eval_row(
    pid: str,
    method: str | None,
    correct: bool | None,
    *,
    think: int | None = 10,
    latency: float | None = None,
    setting: str = "",
    status: str = "ok",
    drafts: int | None = None,
    accepted: int | None = None,
    temperature: float = 0.0,
    info: dict | None = None,
) -> dict:
    return dict(
        problem_id=pid,
        method=method,
        setting=setting,
        temperature=temperature,
        status=status,
        correct=correct,
        think_tokens=think,
        answer_tokens=5,
        latency_s=latency,
        requests=1,
        probe_requests=0,
        num_drafts=drafts,
        num_accepted=accepted,
        info=json.dumps(info or {}),
    )
