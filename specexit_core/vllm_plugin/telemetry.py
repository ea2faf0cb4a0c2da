"""Per-request SpecExit telemetry for vLLM outputs.

The exit is decided in the worker process; vLLM has no per-request field that travels from the
worker to the client, so the hook appends one JSON line per realised exit to
`$SPECEXIT_TELEMETRY_DIR/exits-<pid>.jsonl` (keyed by vLLM's internal request id, which is the
client's id plus a random suffix). A request whose exit logic failed inside the worker runs on
without an exit and gets one line in `fallbacks-<pid>.jsonl` ({req_id, time, fallback: reason});
a separate file, so readers of `exits-*.jsonl` never mistake it for an exit. A finished request
that ran in the long mode gets one line in `long-<pid>.jsonl` (its n-gram / EAGLE-3 draft and
acceptance counts and its penalty, long_mode.py), written when the worker learns it finished, i.e.
at the engine's next step, just after the request's last output left the engine.
`request_telemetry` joins those events with a RequestOutput.

Writing is best effort: the writer runs inside the model runner, so a full disk or an unwritable
folder only counts `errors` (exposed as the `telemetry_errors` counter), never stops the engine.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("specexit.vllm")
# Where the engine appends exit / fallback events (JSON lines, one file per worker process).
TELEMETRY_DIR_ENV = "SPECEXIT_TELEMETRY_DIR"
EXITS = "exits"
FALLBACKS = "fallbacks"
LONG = "long"


class EventWriter:
    """Appends JSON lines to `<directory>/<kind>-<pid>.jsonl`; failures are counted, not raised."""

    def __init__(self, directory: str | None):
        self.dir = directory
        self.errors = 0

    def append(self, kind: str, event: dict) -> bool:
        if not self.dir:
            return False
        try:
            line = json.dumps({**event, "time": event.get("time", time.time())}) + "\n"
            os.makedirs(self.dir, exist_ok=True)
            with open(os.path.join(self.dir, f"{kind}-{os.getpid()}.jsonl"), "a") as f:
                f.write(line)
            return True
        except Exception as e:  # noqa: BLE001 -- OSError, bad values: nothing may reach the engine
            self.errors += 1
            if self.errors == 1 or self.errors % 1000 == 0:
                log.warning("specexit: telemetry write to %s failed (%d so far): %s", self.dir, self.errors, e)
            return False


def _read_events(directory: str | Path, kind: str) -> dict[str, dict]:
    events: dict[str, dict] = {}
    for f in sorted(Path(directory).glob(f"{kind}-*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                ev = json.loads(line) if line.strip() else None
                if ev is not None:
                    events[ev["req_id"]] = ev
            except (ValueError, KeyError, TypeError):
                continue  # a torn or foreign line: skip it, keep the rest
    return events


def read_exit_events(directory: str | Path) -> dict[str, dict]:
    return _read_events(directory, EXITS)


def read_fallback_events(directory: str | Path) -> dict[str, dict]:
    return _read_events(directory, FALLBACKS)


def read_long_events(directory: str | Path) -> dict[str, dict]:
    return _read_events(directory, LONG)


def _external_id(internal_id: str) -> str:
    head, sep, tail = internal_id.rpartition("-")
    return head if sep and len(tail) == 8 else internal_id


def _find(events: dict[str, dict], request_id: str) -> dict | None:
    return next((e for k, e in events.items() if k == request_id or _external_id(k) == request_id), None)


def request_telemetry(
    output, events: dict[str, dict], think_end_id: int, fallbacks: dict[str, dict] | None = None
) -> dict:
    """{think_tokens, exited, exit_index, reason, smoothed, fallback} for one vLLM RequestOutput."""
    ids = list(output.outputs[0].token_ids)
    think = ids.index(think_end_id) if think_end_id in ids else len(ids)
    ev = _find(events, output.request_id)
    fb = _find(fallbacks or {}, output.request_id)
    return {
        "think_tokens": think,
        "exited": ev is not None,
        "exit_index": ev["exit_index"] if ev else None,
        "reason": ev["reason"] if ev else None,
        "smoothed": ev["smoothed"] if ev else None,
        "fallback": fb["fallback"] if fb else None,
    }
