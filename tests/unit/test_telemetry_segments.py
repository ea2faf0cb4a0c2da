"""#43 item 6: the plugin's telemetry files stay bounded. The writer rolls each stream to a new segment past
its size cap; the replica's reader (`ExitEventIndex`) deletes a segment once it has read it and the writer
has moved on, so no event is lost across a roll and the folder's size stays bounded however many events."""

import json
import os
import threading

from serve_app.telemetry import ExitEventIndex
from specexit_core.vllm_plugin.telemetry import (
    EXITS,
    FALLBACKS,
    LONG,
    EventWriter,
    parse_segment,
    read_exit_events,
    segment_name,
)

PID = os.getpid()


def event(i: int) -> dict:
    return {"req_id": f"chatcmpl-r{i}-abcdefgh", "exit_index": i, "reason": "signals", "smoothed": {"c": 0.5}}


def dir_bytes(d) -> int:
    total = 0
    for f in d.iterdir():
        try:
            total += f.stat().st_size
        except FileNotFoundError:
            pass  # deleted meanwhile
    return total


def test_segment_names_round_trip():
    assert segment_name(EXITS, 12, 0) == "exits-12.jsonl"  # the first segment keeps the old name
    assert segment_name(LONG, 12, 3) == "long-12.3.jsonl"
    assert parse_segment("exits-12.jsonl") == ("exits", 12, 0)
    assert parse_segment("fallbacks-7.11.jsonl") == ("fallbacks", 7, 11)
    assert parse_segment("exits-abc.jsonl") is None and parse_segment("notes.txt") is None


def test_the_writer_rolls_past_its_cap_and_keeps_every_line(tmp_path):
    w = EventWriter(str(tmp_path), segment_bytes=1000)
    for i in range(40):
        assert w.append(EXITS, event(i))
    segs = sorted((parse_segment(f.name), f) for f in tmp_path.iterdir())
    assert w.rolls == len(segs) - 1 >= 3
    assert [s[0][2] for s in segs] == list(range(len(segs)))  # 0, 1, 2, ... no gap
    for (_, _, seq), f in segs:
        size = f.stat().st_size
        assert size <= 1000 or f.read_text().count("\n") == 1  # over the cap only as a segment's one line
        assert seq == segs[-1][0][2] or size + 150 > 1000  # a finished segment was full
    assert set(read_exit_events(tmp_path)) == {event(i)["req_id"] for i in range(40)}  # nothing lost


def test_the_writer_alone_keeps_its_newest_segments(tmp_path):
    """No reader deletes (an offline engine): the writer keeps its newest `keep_segments`."""
    w = EventWriter(str(tmp_path), segment_bytes=500, keep_segments=3)
    for i in range(200):
        w.append(FALLBACKS, {"req_id": f"r{i}", "fallback": "x"})
    seqs = sorted(parse_segment(f.name)[2] for f in tmp_path.iterdir())
    assert len(seqs) == 3 and seqs[-1] == w.rolls and dir_bytes(tmp_path) <= 3 * 500


def test_a_second_writer_of_the_stream_goes_on_from_the_newest_segment(tmp_path):
    a = EventWriter(str(tmp_path), segment_bytes=400)
    for i in range(12):
        a.append(EXITS, event(i))
    newest = max(parse_segment(f.name)[2] for f in tmp_path.iterdir())
    b = EventWriter(str(tmp_path), segment_bytes=400)  # the same process's stream: an engine restarted
    b.append(EXITS, event(99))
    assert max(parse_segment(f.name)[2] for f in tmp_path.iterdir()) in (newest, newest + 1)
    assert len(read_exit_events(tmp_path)) == 13


def test_the_reader_follows_a_roll_and_deletes_what_it_read(tmp_path):
    w = EventWriter(str(tmp_path), segment_bytes=600)
    idx = ExitEventIndex(tmp_path)
    w.append(EXITS, event(0))
    assert idx.pop("chatcmpl-r0")["exit_index"] == 0
    for i in range(1, 12):  # several rolls while the reader is away
        w.append(EXITS, event(i))
    assert w.rolls >= 2
    # the reader catches up over every segment, oldest first, and deletes the finished ones
    assert idx.pop("chatcmpl-r11")["exit_index"] == 11
    assert [f.name for f in tmp_path.iterdir()] == [segment_name(EXITS, PID, w.rolls)]
    assert idx.segments_deleted == w.rolls
    for i in range(1, 11):
        assert idx.pop(f"chatcmpl-r{i}")["exit_index"] == i  # read before their segments went
    w.append(EXITS, event(12))  # the newest segment is still read incrementally
    assert idx.pop("chatcmpl-r12")["exit_index"] == 12 and idx.malformed_lines == 0


def test_a_torn_last_line_of_a_finished_segment_is_counted_and_the_segment_deleted(tmp_path):
    (tmp_path / segment_name(EXITS, 5, 0)).write_text(json.dumps(event(1)) + '\n{"req_id": "chatcmpl-to')
    (tmp_path / segment_name(EXITS, 5, 1)).write_text(json.dumps(event(2)) + "\n")
    idx = ExitEventIndex(tmp_path)
    assert idx.pop("chatcmpl-r1")["exit_index"] == 1 and idx.pop("chatcmpl-r2")["exit_index"] == 2
    assert idx.malformed_lines == 1  # the torn line, once: its segment is gone
    assert [f.name for f in tmp_path.iterdir()] == [segment_name(EXITS, 5, 1)]


def test_the_newest_segment_and_foreign_files_are_never_deleted(tmp_path):
    (tmp_path / "exits-abc.jsonl").write_text(json.dumps(event(1)) + "\n")  # no segment name: read, kept
    (tmp_path / segment_name(EXITS, 5, 3)).write_text(json.dumps(event(2)) + "\n")
    idx = ExitEventIndex(tmp_path)
    assert idx.pop("chatcmpl-r1") and idx.pop("chatcmpl-r2")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["exits-5.3.jsonl", "exits-abc.jsonl"]
    kept = ExitEventIndex(tmp_path, prune=False)  # a reader that does not own the folder deletes nothing
    (tmp_path / segment_name(EXITS, 5, 4)).write_text(json.dumps(event(3)) + "\n")
    assert kept.pop("chatcmpl-r3") and len(list(tmp_path.iterdir())) == 3


def test_nothing_lost_and_the_folder_bounded_under_many_events(tmp_path):
    """A writer thread (the engine, at most 64 requests in flight) and a reader (the replica, one pop per
    finished request) at once, on all three streams: every event is joined, and the folder never holds more
    than two segments a stream."""
    cap, n = 2000, 3000
    w = EventWriter(str(tmp_path), segment_bytes=cap)
    idx = ExitEventIndex(tmp_path)
    written, in_flight = threading.Semaphore(0), threading.Semaphore(64)
    peak = 0

    def engine():
        for i in range(n):
            in_flight.acquire()
            if i % 10 == 0:  # ran without SpecExit: a fallback, no exit
                w.append(FALLBACKS, {"req_id": f"chatcmpl-r{i}-abcdefgh", "fallback": "bad settings"})
            else:
                w.append(EXITS, event(i))
            if i % 3 == 0:
                w.append(LONG, {"req_id": f"chatcmpl-r{i}-abcdefgh", "steps": i})
            written.release()

    t = threading.Thread(target=engine)
    t.start()
    got = fallbacks = longs = 0
    for i in range(n):
        written.acquire()  # the response comes after its event
        ev = idx.pop(f"chatcmpl-r{i}")
        got += ev is not None and ev["exit_index"] == i if i % 10 else ev is None
        fallbacks += idx.pop_fallback(f"chatcmpl-r{i}") == "bad settings"
        longs += i % 3 == 0 and idx.has_long(f"chatcmpl-r{i}") and idx.pop_long(f"chatcmpl-r{i}")["steps"] == i
        in_flight.release()
        if i % 50 == 0:
            peak = max(peak, dir_bytes(tmp_path))
    t.join()
    assert (got, fallbacks, longs) == (n, n // 10, n // 3)
    assert w.rolls > 100 and idx.segments_deleted >= w.rolls - 3
    # per stream: the segment being written and at most the finished one not yet read (+ one line each)
    assert peak <= 3 * 2 * (cap + 200), peak
    assert len(list(tmp_path.iterdir())) <= 6 and idx.malformed_lines == 0
