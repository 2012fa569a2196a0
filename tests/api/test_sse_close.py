"""An event stream and a job's feed end when they are told to even when a cancel is lost in a
Redis call (Python 3.11's `asyncio.wait_for` inside redis-py drops one now and then, see
`api.streaming.cancel`): the stream gives its admission place back, the feed its connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from api.routes.events import EventStream
from tests.api.sse_fakes import FakeEvents, hub_of, hub_over

PING = b": ping\n\n"


async def _frames_losing_a_cancel(sent: asyncio.Event) -> AsyncGenerator[bytes, None]:
    """A stream's frames whose store call loses the cancel that the client's leaving sends (as
    `hub.store.get` did: 1 run in about 12 of the API test), then pings on."""
    yield PING
    sent.set()
    with contextlib.suppress(asyncio.CancelledError):  # the cancel lost
        await asyncio.sleep(10)  # in the store call
    while True:
        await asyncio.sleep(0.01)
        yield PING


def test_a_stream_whose_client_left_gives_its_place_back_though_a_cancel_was_lost() -> None:
    hub, _ = hub_over([], max_streams_per_tenant=1)
    sent: list[dict[str, Any]] = []

    async def scenario() -> None:
        first = asyncio.Event()
        stream = EventStream(hub.admit("alice"), _frames_losing_a_cancel(first))
        requests = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if requests:
                return requests.pop()
            await first.wait()
            await asyncio.sleep(0.05)  # the pump is in its store call
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET"}
        await asyncio.wait_for(stream(scope, receive, send), 2)  # type: ignore[arg-type]
        assert hub.slots.total == 0
        hub.admit("alice").release()  # its place is free again

    asyncio.run(scenario())
    assert sent[0]["status"] == 200 and sent[1]["body"] == PING


class BlockingRedis:
    """A streams' client whose XREAD loses the first cancel in its write, as redis-py's can,
    then blocks its 5 s as Redis would."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()

    def register_script(self, source: str) -> None:  # no backlog reads here
        return None

    async def xread(self, streams: dict[str, str], count: int, block: int) -> list[Any]:
        self.reading.set()
        with contextlib.suppress(asyncio.CancelledError):  # lost
            await asyncio.sleep(0.2)  # in the write
        await asyncio.sleep(block / 1000)
        return []


def test_a_feed_whose_cancel_was_lost_ends_without_running_out_its_block() -> None:
    streams = BlockingRedis()
    hub = hub_of(FakeEvents([]), stream_client=streams)

    async def scenario() -> None:
        async with hub.subscribe("job"):
            feed = hub.feeds["job"]
            await streams.reading.wait()
        assert feed.task is not None
        done, _ = await asyncio.wait([feed.task], timeout=1)
        assert done == {feed.task} and feed.task.cancelled()

    asyncio.run(scenario())
