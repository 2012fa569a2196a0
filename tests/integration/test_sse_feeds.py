"""The event hub's live feeds and its Redis connections, in this process against a real Redis:
a job's feed serves every subscriber while any is left and goes away with the last, and the
hub's shutdown closes the connections it opened and no others. (The streams through the API are
in test_sse_load.py and test_event_ids.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import redis
import redis.asyncio as aioredis

from api.streaming.events import EventHub, Subscriber
from pdppo.settings import Settings
from pdppo.store import AsyncJobStore, events_key
from tests.support.stack import REDIS_DATABASES, RedisServer

DB = REDIS_DATABASES - 1  # no service's


def hub_on(url: str, client: aioredis.Redis) -> EventHub:
    return EventHub.from_settings(client, AsyncJobStore(client), Settings(redis_url=url))


def test_a_feed_serves_its_remaining_subscribers_and_goes_away_with_the_last(
    redis_server: RedisServer,
) -> None:
    """Two subscribers of a running job; one leaves: the other still gets the next event from
    the same feed. The last one leaves: the feed is gone from the hub at once and its task
    cancelled (not left to run out its 5 s block and find no subscriber)."""
    url = redis_server.url(DB)
    key = events_key("feeds-job")

    async def next_ids(sub: Subscriber) -> list[str]:
        batches = await asyncio.wait_for(sub.take(), 3) or []
        return [f"{f.id[0]}-{f.id[1]}" for b in batches for f in b.frames]

    async def scenario() -> None:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        hub = hub_on(url, client)
        await client.delete(key)
        async with contextlib.AsyncExitStack() as stay, contextlib.AsyncExitStack() as leave:
            staying = await stay.enter_async_context(hub.subscribe("feeds-job"))
            await leave.enter_async_context(hub.subscribe("feeds-job"))
            feed = hub.feeds["feeds-job"]
            await asyncio.sleep(0.1)  # the feed is in its XREAD
            await leave.aclose()
            assert hub.feeds == {"feeds-job": feed} and not feed.finished
            new = await client.xadd(key, {"type": "log", "data": json.dumps({"n": 1})})
            assert await next_ids(staying) == [new]
        assert hub.feeds == {} and feed.task is not None and feed.task.cancelling() == 1
        # And it ends within a second, not its block (5 s): the XREAD loses the cancel now
        # and then (1 run in 10 did, before `cancel_until_done`).
        await asyncio.wait([feed.task], timeout=1)
        assert feed.task.cancelled()
        await hub.close()
        await client.aclose()

    asyncio.run(scenario())


def test_closing_the_hub_closes_its_stream_connections_only(redis_server: RedisServer) -> None:
    """The API's shutdown: the hub closes the streams' pool it made, and leaves the requests'
    client, which it was given, to its owner."""
    url = redis_server.url(DB)
    store = redis.Redis.from_url(url)

    def connections() -> int:
        return sum(c["db"] == str(DB) for c in store.client_list())

    async def scenario() -> tuple[int, int, bool]:
        client = aioredis.Redis.from_url(url)
        hub = hub_on(url, client)
        await client.ping()
        await hub.stream_redis.ping()
        before = connections()
        await hub.close()
        deadline = time.monotonic() + 5  # Redis sees the socket close a moment later
        while (after := connections()) == before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        alive = bool(await client.ping())
        await client.aclose()
        return before, after, alive

    before, after, alive = asyncio.run(scenario())
    store.close()
    assert (before - after, alive) == (1, True)


def test_closing_the_hub_ends_every_live_stream_and_its_feed(redis_server: RedisServer) -> None:
    """The API's shutdown with streams open on two jobs: each subscriber's stream ends (its
    client reconnects, to another API process, with Last-Event-ID) and each feed's XREAD is
    cancelled, rather than the streams holding the shutdown until uvicorn cuts them."""
    url = redis_server.url(DB)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        hub = hub_on(url, client)
        async with (
            hub.subscribe("close-a") as a1,
            hub.subscribe("close-a") as a2,
            hub.subscribe("close-b") as b,
        ):
            feeds = [hub.feeds["close-a"], hub.feeds["close-b"]]
            await asyncio.sleep(0.1)  # both feeds are in their XREAD
            await hub.close()
            assert hub.feeds == {}  # at once, not as each subscriber leaves
            ends = asyncio.gather(a1.take(), a2.take(), b.take())
            assert await asyncio.wait_for(ends, 3) == [None, None, None]
        await asyncio.wait([f.task for f in feeds if f.task is not None], timeout=1)
        assert [f.task is not None and f.task.cancelled() for f in feeds] == [True, True]
        await client.aclose()

    asyncio.run(scenario())


def test_a_feed_ends_by_itself_with_its_jobs_done(redis_server: RedisServer) -> None:
    """The job's `done` reaches the subscriber, and the feed ends there on its own (its task
    returns, not cancelled), out of the hub while its subscriber is still finishing."""
    url = redis_server.url(DB)
    key = events_key("done-job")

    async def scenario() -> None:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        hub = hub_on(url, client)
        await client.delete(key)
        async with hub.subscribe("done-job") as sub:
            feed = hub.feeds["done-job"]
            await asyncio.sleep(0.1)  # the feed is in its XREAD
            done = await client.xadd(key, {"type": "done", "data": json.dumps({})})
            batches = await asyncio.wait_for(sub.take(), 3) or []
            assert [f.event for b in batches for f in b.frames] == ["done"]
            assert feed.task is not None
            await asyncio.wait([feed.task], timeout=3)
            assert feed.task.done() and not feed.task.cancelled()
            assert feed.finished and hub.feeds == {} and feed.cursor == done
        await hub.close()
        await client.aclose()

    asyncio.run(scenario())
