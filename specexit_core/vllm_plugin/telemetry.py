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

The files stay bounded (#43 item 6): each `<kind>-<pid>` stream is a series of segments,
`<kind>-<pid>.jsonl` first, then `<kind>-<pid>.1.jsonl`, `.2`, ... A writer appends to its newest
segment; when a line would take it past `$SPECEXIT_TELEMETRY_SEGMENT_BYTES` (default 1 MiB) it starts
the next one and never touches the older one again. The reader that needs the events, the engine
replica's `ExitEventIndex` (serve_app/telemetry.py), deletes a segment once it has read it to the end
and a newer segment of the same stream exists, so nothing is deleted before it was read: one stream
holds at most its current segment and the one before it while the replica keeps up. Without such a
reader (an offline engine a test reads afterwards) the writer keeps the newest `KEEP_SEGMENTS` (8) and
deletes older ones when it rolls: a bound that no live reader ever reaches (it would have to lag 7
segments, thousands of events, behind).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path

log = logging.getLogger("specexit.vllm")
# Where the engine appends exit / fallback events (JSON lines, one file per worker process).
TELEMETRY_DIR_ENV = "SPECEXIT_TELEMETRY_DIR"
EXITS = "exits"
FALLBACKS = "fallbacks"
LONG = "long"

# A segment grows to about this many bytes before the writer starts the next one.
SEGMENT_BYTES_ENV = "SPECEXIT_TELEMETRY_SEGMENT_BYTES"
DEFAULT_SEGMENT_BYTES = 1 << 20
KEEP_SEGMENTS = 8  # the writer's own bound: segments of one stream kept when no reader deletes them
_SEGMENT = re.compile(r"^([a-z_]+)-(\d+)(?:\.(\d+))?\.jsonl$")


def segment_name(kind: str, pid: int, seq: int) -> str:
    """File name of segment `seq` of one writer process's `kind` stream (seq 0 keeps the old name)."""
    return f"{kind}-{pid}.jsonl" if seq == 0 else f"{kind}-{pid}.{seq}.jsonl"


def parse_segment(name: str) -> tuple[str, int, int] | None:
    """(kind, pid, seq) of a segment's file name; None for any other name."""
    m = _SEGMENT.match(name)
    return (m.group(1), int(m.group(2)), int(m.group(3) or 0)) if m else None


def segment_bytes_from_env() -> int:
    try:
        v = int(os.environ.get(SEGMENT_BYTES_ENV) or DEFAULT_SEGMENT_BYTES)
    except ValueError:
        v = DEFAULT_SEGMENT_BYTES
    return max(v, 1)


# The newest segment of each (folder, kind, pid) stream, shared by every writer in the process: two
# writers of one stream (an engine restarted in the same process) must never write one segment each.
_streams: dict[tuple[str, str, int], int] = {}
_lock = threading.Lock()


class EventWriter:
    """Appends JSON lines to the newest segment of `<directory>/<kind>-<pid>` (see the module docstring);
    failures are counted, not raised."""

    def __init__(self, directory: str | None, segment_bytes: int | None = None, keep_segments: int = KEEP_SEGMENTS):
        self.dir = directory
        self.errors = 0
        self.segment_bytes = segment_bytes or segment_bytes_from_env()
        self.keep_segments = max(keep_segments, 2)
        self.rolls = 0

    def append(self, kind: str, event: dict) -> bool:
        if not self.dir:
            return False
        try:
            line = (json.dumps({**event, "time": event.get("time", time.time())}) + "\n").encode()
            with _lock:
                self._write(kind, line)
            return True
        except Exception as e:  # noqa: BLE001 -- OSError, bad values: nothing may reach the engine
            self.errors += 1
            if self.errors == 1 or self.errors % 1000 == 0:
                log.warning("specexit: telemetry write to %s failed (%d so far): %s", self.dir, self.errors, e)
            return False

    def _write(self, kind: str, line: bytes) -> None:
        os.makedirs(self.dir, exist_ok=True)
        pid = os.getpid()
        key = (self.dir, kind, pid)
        seq = _streams.get(key)
        if seq is None:  # this stream's first line in this process: go on from a segment already there
            seq = self._newest(kind, pid)
        path = os.path.join(self.dir, segment_name(kind, pid, seq))
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = 0
        rolled = size > 0 and size + len(line) > self.segment_bytes
        if rolled:  # this segment is finished: nothing is written to it again
            seq += 1
            path = os.path.join(self.dir, segment_name(kind, pid, seq))
        with open(path, "ab") as f:
            f.write(line)
        _streams[key] = seq
        if rolled:
            self.rolls += 1
            self._prune(kind, pid, seq)

    def _segments(self) -> list[tuple[str, int, int]]:
        return [s for n in os.listdir(self.dir) if (s := parse_segment(n)) is not None]

    def _newest(self, kind: str, pid: int) -> int:
        return max((s for k, p, s in self._segments() if (k, p) == (kind, pid)), default=0)

    def _prune(self, kind: str, pid: int, seq: int) -> None:
        """Segments of this stream older than the newest `keep_segments` (a reader deletes them first)."""
        for k, p, s in self._segments():
            if (k, p) == (kind, pid) and s <= seq - self.keep_segments:
                try:
                    os.unlink(os.path.join(self.dir, segment_name(k, p, s)))
                except FileNotFoundError:
                    pass  # the reader was first


def _read_events(directory: str | Path, kind: str) -> dict[str, dict]:
    events: dict[str, dict] = {}
    files = Path(directory).glob(f"{kind}-*.jsonl")
    for f in sorted(files, key=lambda f: (parse_segment(f.name) or (kind, -1, 0), f.name)):  # oldest first
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
