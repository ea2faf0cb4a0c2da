"""Per-request SpecExit telemetry for vLLM outputs.

The exit is decided in the worker process; vLLM has no per-request field that travels from the
worker to the client, so the hook appends one JSON line per realised exit to
`$SPECEXIT_TELEMETRY_DIR/exits-<pid>.jsonl` (keyed by vLLM's internal request id, which is the
client's id plus a random suffix). `request_telemetry` joins those events with a RequestOutput.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_exit_events(directory: str | Path) -> dict[str, dict]:
    events: dict[str, dict] = {}
    for f in sorted(Path(directory).glob("exits-*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                ev = json.loads(line)
                events[ev["req_id"]] = ev
    return events


def _external_id(internal_id: str) -> str:
    head, sep, tail = internal_id.rpartition("-")
    return head if sep and len(tail) == 8 else internal_id


def request_telemetry(output, events: dict[str, dict], think_end_id: int) -> dict:
    """{think_tokens, exited, exit_index, reason, smoothed} for one vLLM RequestOutput."""
    ids = list(output.outputs[0].token_ids)
    think = ids.index(think_end_id) if think_end_id in ids else len(ids)
    ev = next((e for k, e in events.items() if k == output.request_id or _external_id(k) == output.request_id), None)
    return {
        "think_tokens": think,
        "exited": ev is not None,
        "exit_index": ev["exit_index"] if ev else None,
        "reason": ev["reason"] if ev else None,
        "smoothed": ev["smoothed"] if ev else None,
    }
