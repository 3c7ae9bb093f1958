"""A stream's chunks as recorded (sizes always, times only when asked) and as cut for replay."""

from __future__ import annotations

import time

from noisefloor.proxy.record.sse import ChunkCapture, stream_pieces
from noisefloor.proxy.request.traffic import ResponseData


def test_a_capture_keeps_times_only_when_timed():
    plain, timed = ChunkCapture(), ChunkCapture(timed=True)
    for capture in (plain, timed):
        assert capture(b"data: a\n\n") == b"data: a\n\n"  # forwarded unchanged
        time.sleep(0.02)
        capture(b"data: b\n\n")
        capture(b"")
    assert plain.offsets_ms == [None, None] and plain.complete and plain.body == b"data: a\n\ndata: b\n\n"
    first, second = timed.offsets_ms
    assert isinstance(first, float) and isinstance(second, float) and second - first >= 15


def test_a_capture_over_its_limit_holds_no_chunks_and_no_times():
    capture = ChunkCapture(limit=10, timed=True)
    capture(b"123456")
    capture(b"789012")
    assert capture.over_limit and capture.chunks == [] and capture.offsets_ms == []


def test_pieces_are_the_recorded_chunks_with_due_times_only_when_timed():
    body = b"aaabbbbcc"
    layout = ((0.5, 3), (40.0, 4), (90.0, 2))
    assert stream_pieces(body, layout, timed=False) == ([b"aaa", b"bbbb", b"cc"], None)
    chunks, due = stream_pieces(body, layout, timed=True)
    assert chunks == [b"aaa", b"bbbb", b"cc"] and due == [0.0005, 0.04, 0.09]


def test_bytes_past_the_recorded_sizes_go_out_last_at_the_last_time():
    chunks, due = stream_pieces(b"aaabbXY", ((1.0, 3), (2.0, 2)), timed=True)
    assert chunks == [b"aaa", b"bb", b"XY"] and due == [0.001, 0.002, 0.002]
    assert stream_pieces(b"XY", (), timed=True) == ([b"XY"], [0.0])


def test_untimed_chunks_are_stored_as_null_offsets_and_read_back_untimed():
    headers = (("content-type", "text/event-stream"),)
    untimed = ResponseData(200, headers, b"aaabb", ((None, 3), (None, 2)))
    rec = untimed.record()
    assert rec["chunks"] == [[None, 3], [None, 2]]
    back = ResponseData.from_record(rec, b"aaabb")
    assert back.layout == ((None, 3), (None, 2)) and not back.timed
    timed = ResponseData.from_record(ResponseData(200, headers, b"aaabb", ((0.2, 3), (5.0, 2))).record(), b"aaabb")
    assert timed.layout == ((0.2, 3), (5.0, 2)) and timed.timed
    assert not ResponseData(200, headers, b"x").timed  # a whole body is no stream
