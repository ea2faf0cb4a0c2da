"""SpecExit telemetry in the OpenAI `usage` object (`usage.specexit`).

The exit is decided in the engine's worker process; the plugin appends each realised exit to
`$SPECEXIT_TELEMETRY_DIR/exits-<pid>.jsonl`, and each request whose exit logic failed in the
worker (it ran on without an exit) to `fallbacks-<pid>.jsonl` (see
specexit_core/vllm_plugin/telemetry.py). The engine replica tails both (`ExitEventIndex`) and joins
them with the finished response by request id; think tokens are counted from the generated token ids, which the replica asks vLLM
for (`return_token_ids`) and strips again unless the client asked for them.

The files stay bounded: the writer rolls each stream to a new segment past a size cap, and the index
deletes a segment once it has read it to the end and a newer one of the same stream exists (the writer
never writes to it again), so it never deletes a line it has not read. The folder then holds, per
stream, the segment being written and at most the one before it.
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

from specexit_core.vllm_plugin.telemetry import EXITS, FALLBACKS, LONG, parse_segment

_CHILD = re.compile(r"^(\d+)_(.*)$")


def split_internal_id(internal_id: str) -> tuple[str, int]:
    """vLLM internal id -> (response id, choice index). The engine appends `-<8 chars>` to the
    id the OpenAI layer made (`chatcmpl-…` / `cmpl-…`); with n > 1 each choice is a child
    request `<i>_<parent id>`."""
    choice = 0
    m = _CHILD.match(internal_id)
    if m:
        choice, internal_id = int(m.group(1)), m.group(2)
    head, sep, tail = internal_id.rpartition("-")
    base = head if sep and len(tail) == 8 else internal_id
    return base, choice


class ExitEventIndex:
    """Incremental reader of the exit- and fallback-event files of one engine (one folder per replica).
    `prune`: delete the segments it has read that the writer has finished (the replica owns its folder)."""

    def __init__(self, directory: str | Path, max_events: int = 20000, prune: bool = True):
        self.dir = Path(directory)
        self.max_events = max_events
        self.prune = prune
        self._offsets: dict[Path, int] = {}
        self._events: OrderedDict[tuple[str, int], dict] = OrderedDict()
        self._fallbacks: OrderedDict[tuple[str, int], dict] = OrderedDict()
        self._long: OrderedDict[tuple[str, int], dict] = OrderedDict()
        self.malformed_lines = 0  # torn / foreign lines skipped (telemetry is never fatal)
        self.segments_deleted = 0

    def _refresh(self) -> None:
        # Every response asks (an event is written just before its response): one listing and a
        # size check per file, and only a file that grew is opened (was ~0.24 CPU-ms per request).
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return
        for kind, store in ((EXITS, self._events), (FALLBACKS, self._fallbacks), (LONG, self._long)):
            files = _segments_oldest_first(n for n in names if n.startswith(f"{kind}-") and n.endswith(".jsonl"))
            for name, finished in files:
                f = self.dir / name
                self._read_new(f, store, finished)
                if finished and self.prune:
                    try:
                        os.unlink(f)
                        self.segments_deleted += 1
                    except FileNotFoundError:
                        pass  # the writer's own bound was first
                    self._offsets.pop(f, None)
            while len(store) > self.max_events:  # events of requests nobody asked about (aborted)
                store.popitem(last=False)
        if len(self._offsets) > len(names):  # files gone meanwhile: forget their offsets
            listed = {self.dir / n for n in names}
            self._offsets = {f: o for f, o in self._offsets.items() if f in listed}

    def _read_new(self, f: Path, store: OrderedDict, finished: bool = False) -> None:
        """The lines of `f` after its offset; `finished` (the writer has moved to a newer segment): every
        byte, a torn last line included (counted as malformed), else up to the last newline."""
        off = self._offsets.get(f, 0)
        try:
            if os.stat(f).st_size <= off:
                return  # nothing new (a file that shrank is read from where it was, as before: nothing)
            with open(f, "rb") as fh:
                fh.seek(off)
                data = fh.read()
        except FileNotFoundError:
            return
        end = len(data) if finished else data.rfind(b"\n") + 1  # a line still being written waits
        self._offsets[f] = off + end  # first: a bad line below must never be read again
        for line in data[:end].splitlines():
            if line.strip():
                try:
                    ev = json.loads(line)
                    key = split_internal_id(ev["req_id"])
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.malformed_lines += 1  # counted, skipped: the responses go on
                    continue
                store[key] = ev  # TP ranks log the same event

    def pop(self, response_id: str, choice: int = 0) -> dict | None:
        """The exit event of one choice (consumed), or None."""
        key = (response_id, choice)
        if key not in self._events:
            self._refresh()
        return self._events.pop(key, None)

    def pop_fallback(self, response_id: str, choice: int = 0) -> str | None:
        """Why one choice ran without SpecExit (consumed), or None. Call after `pop`, which refreshed."""
        ev = self._fallbacks.pop((response_id, choice), None)
        return str(ev.get("fallback") or "unknown") if ev is not None else None

    def has_long(self, response_id: str, choice: int = 0) -> bool:
        """Whether the long-mode event of one choice is there (reads new lines when it is not yet)."""
        key = (response_id, choice)
        if key not in self._long:
            self._refresh()
        return key in self._long

    def pop_long(self, response_id: str, choice: int = 0) -> dict | None:
        """The long-mode counts of one choice (consumed; call after `has_long` or `pop`), or None."""
        ev = self._long.pop((response_id, choice), None)
        return {k: v for k, v in ev.items() if k not in ("req_id", "time")} if ev is not None else None


def _segments_oldest_first(names) -> list[tuple[str, bool]]:
    """(file name, finished) in writing order: per writer stream by segment number, every segment but the
    newest finished; a name that is no segment (a foreign file) is read, never deleted."""
    streams: dict[tuple[str, int], list[tuple[int, str]]] = {}
    out = []
    for n in sorted(names):
        seg = parse_segment(n)
        if seg is None:
            out.append((n, False))
        else:
            streams.setdefault(seg[:2], []).append((seg[2], n))
    for segs in streams.values():
        segs.sort()
        out += [(n, i < len(segs) - 1) for i, (_, n) in enumerate(segs)]
    return out


def choice_telemetry(
    token_ids: list[int],
    think_end_id: int | None,
    event: dict | None,
    fallback: str | None = None,
    long: dict | None = None,
    thinking_closed: bool = False,
    think_start_id: int | None = None,
) -> dict:
    """One choice's fields. think_tokens: generated tokens before the first `</think>` (all of them
    when it never came, none when the prompt closed thinking: `thinking_closed`, e.g. effort `none`,
    `enable_thinking: false`), the markers not counted: a `<think>` the model writes itself (Qwen3)
    is not a think token, as for a think budget; with an exit, the tokens up to and including the
    split token. fallback: why
    the worker ran this choice without SpecExit (its settings or the hook failed), else None. long:
    the long mode's counts ({config, steps, ngram_/eagle_ steps, drafted_tokens, accepted_tokens,
    penalised_rows, fallback}), None for a request without it."""
    ids = list(token_ids or [])
    if think_end_id is not None and think_end_id in ids:
        think = ids.index(think_end_id)
    else:
        think = 0 if thinking_closed else len(ids)
    if think and think_start_id is not None and ids[0] == think_start_id:
        think -= 1  # the model's own opening marker
    smoothed = (event or {}).get("smoothed") or None
    remaining = smoothed.get("remaining") if smoothed else None
    return {
        "think_tokens": think,
        "exited": event is not None,
        "exit_index": event["exit_index"] if event else None,
        "exit_reason": event["reason"] if event else None,
        "saved_tokens_estimate": int(round(remaining)) if remaining is not None else None,
        "signals": smoothed,
        "fallback": fallback,
        "long": long,
    }


def long_block(choices: list[dict]) -> dict | None:
    """`usage.specexit.long`: the counts summed over the choices that ran in the long mode, with the
    first one's config and fallback (n = 1: exactly that choice's)."""
    longs = [c["long"] for c in choices if c.get("long")]
    if not longs:
        return None
    out = dict(longs[0])
    for other in longs[1:]:
        for k, v in other.items():
            if isinstance(v, int) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
    out["fallback"] = next((x["fallback"] for x in longs if x.get("fallback")), None)
    return out


def usage_block(enabled: bool, choices: list[dict], effort: dict | None = None) -> dict:
    """`usage.specexit`: sums over the choices (n = 1: exactly that choice), plus `choices` when n > 1.
    `fallback` at the top: the first choice's reason that fell back, if any did. `effort`: the
    request's reasoning effort ({effort, served_by, epsilon}: `ExitDefaults.for_effort`), or None."""
    out: dict[str, Any] = {
        "enabled": enabled,
        "effort": effort,
        "think_tokens": sum(c["think_tokens"] for c in choices),
        "exited": any(c["exited"] for c in choices),
        "exit_index": choices[0]["exit_index"] if len(choices) == 1 else None,
        "exit_reason": choices[0]["exit_reason"] if len(choices) == 1 else None,
        "saved_tokens_estimate": (
            sum(c["saved_tokens_estimate"] or 0 for c in choices)
            if any(c["saved_tokens_estimate"] is not None for c in choices)
            else None
        ),
        "signals": choices[0]["signals"] if len(choices) == 1 else None,
        "fallback": next((c["fallback"] for c in choices if c.get("fallback")), None),
        "long": long_block(choices),
    }
    if len(choices) > 1:
        out["choices"] = choices
    return out
