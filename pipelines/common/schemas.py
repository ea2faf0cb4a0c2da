"""Parquet schemas of the pipeline outputs (documented in pipelines/README.md).

Every output row has `id` (unique per input row), `status` ("ok" | "error") and `error` (the
reason, null when ok): a bad row becomes an error row instead of failing the job, so
`ok + errors == input rows` always holds.
"""

from __future__ import annotations

import pyarrow as pa

_ids = pa.list_(pa.int32())
_f32 = pa.list_(pa.float32())

COMMON = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("error", pa.string()),
]

TRACES = pa.schema(
    COMMON
    + [
        pa.field("prompt", pa.string()),  # the user message as read from the input
        pa.field("gold", pa.string()),  # gold answer if the input has one
        pa.field("prompt_token_ids", _ids),  # chat-templated prompt (the generation prompt may open <think>)
        pa.field("completion_token_ids", _ids),  # generated ids, EOS stripped
        pa.field("completion_text", pa.string()),
        pa.field("reasoning", pa.string()),  # text of the think segment
        pa.field("answer", pa.string()),  # text after </think> ("" if the think segment never closed)
        pa.field("finished_think", pa.bool_()),  # </think> was generated
        pa.field("finish_reason", pa.string()),  # "stop" (EOS) | "length"
        pa.field("num_prompt_tokens", pa.int32()),
        pa.field("num_completion_tokens", pa.int32()),
    ]
)

LABELS = pa.schema(
    COMMON
    + [
        pa.field("gold", pa.string()),
        pa.field("reference", pa.string()),  # what probes were graded against: gold, else the trace's own answer
        pa.field("prompt_token_ids", _ids),
        pa.field("completion_token_ids", _ids),
        # per completion token (same length as completion_token_ids); 0 / False outside <think>
        pa.field("confidence", _f32),
        pa.field("progress", _f32),
        pa.field("remaining", _f32),
        pa.field("log_remaining", _f32),
        pa.field("mask", pa.list_(pa.bool_())),
        pa.field("boundaries", _ids),  # completion indices of the step-split tokens probed
        pa.field("probe_outcomes", _f32),  # one graded forced answer per boundary
        pa.field("think_start", pa.int32()),
        pa.field("think_end", pa.int32()),  # index of </think> in the completion
        pa.field("final_correct", pa.bool_()),  # the trace's own answer matches the reference
    ]
)

SCHEMAS = {"traces": TRACES, "labels": LABELS}


def empty_row(schema: pa.Schema, row_id: str, error: str, **known) -> dict:
    """An error row: every column present (nulls), so parts always share one schema."""
    row = {f.name: None for f in schema}
    row.update(known)
    row.update(id=row_id, status="error", error=error)
    return row


def to_table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)
