"""The event stream's pages as SSE frames, built in Redis (`pdppo.store.jobs.events._ENCODED_PAGE`),
entry by entry: each field where it belongs, whatever order the entry holds them in, the
defaults of a missing one, and the newlines a frame cannot carry."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aredis

from pdppo.store.jobs.events import AsyncEventStore, EncodedPage
from pdppo.store.keys import events_key
from tests.support.stack import RedisServer

# the entry's fields, in stream order -> its frame's event and data lines
CASES = [
    ({"type": "metrics", "data": '{"step": 1}'}, "metrics", 'data: {"step": 1}'),
    ({"data": '{"step": 2}', "type": "eval"}, "eval", 'data: {"step": 2}'),  # data first
    ({"data": '{"message": "hi"}'}, "log", 'data: {"message": "hi"}'),  # no type: a log
    ({"type": "status"}, "status", "data: {}"),  # no data: {}
    (
        {"type": "st\r\natus", "data": "a\nb\r\nc\rd"},
        "status",
        "data: a\r\ndata: b\r\ndata: c\r\ndata: d",
    ),
]


@pytest.mark.parametrize(("fields", "event", "data"), CASES)
def test_an_entry_becomes_its_frame(
    server: RedisServer, fields: dict[str, str], event: str, data: str
) -> None:
    sync = redis.Redis.from_url(server.url(), decode_responses=True)
    try:
        sync.xadd(events_key("j"), fields, id="5-1")
    finally:
        sync.close()

    async def page() -> EncodedPage:
        conn = aredis.Redis.from_url(server.url(), decode_responses=True)
        try:
            return await AsyncEventStore(conn).encoded_events_after("j", (0, 0), 10)
        finally:
            await conn.aclose()

    frame = f"id: 5-1\r\nevent: {event}\r\n{data}\r\n\r\n"
    assert asyncio.run(page()) == EncodedPage(frame.encode(), "5-1", 1, False)
