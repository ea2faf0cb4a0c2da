"""#16 item 2: a malformed exit-event line is skipped and counted; later lines still join."""

from serve_app.telemetry import ExitEventIndex


def test_malformed_lines_are_skipped_counted_and_never_reread(tmp_path):
    f = tmp_path / "exits-1.jsonl"
    f.write_text(
        '{"req_id": "chatcmpl-a-abcdefgh", "exit_index": 3}\n'
        '{"req_id": "chatcmpl-b-abcd\n'  # torn by a full disk
        '["not", "an", "event"]\n'
        '{"no_req_id": 1}\n'
        '{"req_id": "chatcmpl-c-abcdefgh", "exit_index": 7}\n'
    )
    idx = ExitEventIndex(tmp_path)
    assert idx.pop("chatcmpl-c")["exit_index"] == 7
    assert idx.malformed_lines == 3
    assert idx.pop("chatcmpl-a")["exit_index"] == 3
    with open(f, "a") as fh:
        fh.write('{"req_id": "chatcmpl-d-abcdefgh", "exit_index": 9}\n')
    assert idx.pop("chatcmpl-d")["exit_index"] == 9
    assert idx.malformed_lines == 3  # the offset moved past the bad lines
    assert idx.pop("chatcmpl-b") is None
