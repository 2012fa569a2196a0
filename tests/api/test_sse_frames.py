"""SSE frames without a server: event ids, the frames' encoding, batches cut at `done`, writes
of at most WRITE_BYTES."""

from __future__ import annotations

import json

import pytest
from sse_starlette import ServerSentEvent

from api.streaming.sse_frames import WRITE_BYTES, Batch, encode, frames_after, pieces
from pdppo.store.jobs.events import EventIdError, parse_event_id
from tests.api.sse_fakes import Entry, entries, event_ids


def test_parse_event_id_accepts_stream_ids_and_refuses_the_rest() -> None:
    assert parse_event_id("1700000000000-3") == (1700000000000, 3)
    assert parse_event_id("5") == (5, 0)
    assert parse_event_id(f"{2**64 - 1}-{2**64 - 1}") == (2**64 - 1, 2**64 - 1)
    for bad in ("", "x", "1-", "-1", "1-2-3", "1.5", " 1-2", "1_000-0", "9" * 21):
        with pytest.raises(EventIdError, match="is not an event id"):
            parse_event_id(bad)
    for too_big in (f"{2**64}-0", f"0-{2**64}", "99999999999999999999"):
        with pytest.raises(EventIdError, match="out of range"):
            parse_event_id(too_big)
    # a client's id is echoed in the 400's detail, cut short: the id's first 40 characters
    with pytest.raises(EventIdError) as bad_id:
        parse_event_id("x" * 100)
    assert str(bad_id.value) == f"{'x' * 40!r} is not an event id like 1700000000000-0"
    longest = "9" * 20 + "-" + "9" * 20  # an id matches 41 characters at most: all echoed
    with pytest.raises(EventIdError) as huge:
        parse_event_id(longest)
    assert str(huge.value) == (
        f"{longest!r} is out of range: both parts of an event id are below 2^64"
    )


@pytest.mark.parametrize(
    "entry",
    [
        ("1-0", {"type": "metrics", "data": json.dumps({"step": 1, "m": {"a": 0.5}})}),
        ("2-7", {"type": "log", "data": json.dumps({"message": "two\nlines"})}),
        ("3-0", {"type": "log", "data": "raw\r\ntext"}),  # not JSON: the slow path
        ("4-0", {"data": "{}"}),  # no type: a log
        # A lone line break of either kind, in the data or in the event's name, would split the
        # frame (SSE ends a line at \r, \n or \r\n): the slow path, which cuts or strips them.
        ("5-0", {"type": "log", "data": "a\nb"}),
        ("6-0", {"type": "log", "data": "a\rb"}),
        ("7-0", {"type": "lo\ng", "data": "{}"}),
        ("8-0", {"type": "lo\rg", "data": "{}"}),
    ],
)
def test_encode_writes_what_server_sent_event_writes(entry: Entry) -> None:
    entry_id, fields = entry
    event = fields.get("type", "log")
    expected = ServerSentEvent(data=fields["data"], event=event, id=entry_id).encode()
    assert encode(entry).data == expected


def test_batch_stops_at_done_and_after_skips_what_was_sent() -> None:
    batch = Batch.of(entries(1, 5, done_at=3))
    assert [f.id for f in batch.frames] == [(1, 0), (2, 0), (3, 0)] and batch.done
    chunk, last, done = frames_after([Batch.of(entries(1, 4))], (2, 0), (0, 0))
    assert chunk.count(b"event: ") == 2 and last == (4, 0) and not done
    # A client ahead of the stream (its id 10-0) gets the later `done` all the same...
    chunk, last, done = frames_after([Batch.of(entries(5, 3, done_at=7))], (10, 0), (10, 0))
    assert chunk.count(b"event: done") == 1 and chunk.count(b"event: ") == 1 and done
    # ...but not a `done` that *is* its id: it has seen it.
    chunk, _, done = frames_after([Batch.of(entries(5, 3, done_at=7))], (7, 0), (7, 0))
    assert chunk == b"" and done


def test_a_batch_after_the_clients_id_goes_out_as_its_shared_chunk() -> None:
    """The usual live case, one batch all new to the client: its chunk as it is (one object for
    every subscriber, not a copy each), the batch's last id and whether it ended."""
    batch = Batch.of(entries(3, 3))
    assert batch.last == (5, 0) and Batch.of([]).last is None
    chunk, last, done = frames_after([batch], (2, 0), (0, 0))
    assert chunk is batch.chunk and last == (5, 0) and not done
    ended = Batch.of(entries(3, 3, done_at=5))
    chunk, last, done = frames_after([ended], (2, 0), (0, 0))
    assert chunk is ended.chunk and last == (5, 0) and done


def test_frames_after_joins_batches_and_skips_the_clients_own_id() -> None:
    first, second = Batch.of(entries(1, 2)), Batch.of(entries(3, 2))
    chunk, last, done = frames_after([first, second], (0, 0), (0, 0))
    assert event_ids(chunk) == ["1-0", "2-0", "3-0", "4-0"] and last == (4, 0) and not done
    # A batch that starts with the frame the client has: that frame is not sent again.
    chunk, last, done = frames_after([second], (3, 0), (0, 0))
    assert event_ids(chunk) == ["4-0"] and last == (4, 0) and not done


def test_pieces_are_bounded_and_lose_nothing() -> None:
    big = b"x" * (200 * 1024 + 17)
    assert b"".join(bytes(p) for p in pieces(big)) == big
    assert max(len(p) for p in pieces(big)) <= 64 * 1024
    assert list(pieces(b"")) == []


def test_a_chunk_that_fits_one_write_goes_out_uncopied() -> None:
    """Up to WRITE_BYTES a shared chunk is written as it is: a thousand subscribers of one
    batch hold one chunk, not a thousand copies."""
    for size in (1, WRITE_BYTES):
        chunk = b"x" * size
        (piece,) = pieces(chunk)
        assert piece is chunk
