"""One client's event stream (`api.streaming.sse_stream.job_events`) without a server: where it
starts, how a Redis error ends it, a job that ends while the stream looks at it, and when the first
ping of an idle stream comes. The integration tests (`tests/integration/test_event_ids.py`,
`test_sse_feeds.py`) show the same through a real API and Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

import pytest
import redis.exceptions

from api.streaming.events import BACKLOG_PAGE
from api.streaming.sse_frames import PING
from api.streaming.sse_stream import job_events
from pdppo.store import JobRecord
from pdppo.store.jobs.events import EncodedPage
from tests.api.sse_fakes import (
    FakeEvents,
    FakeJob,
    FakeStore,
    IdleRedis,
    drain,
    entries,
    event_ids,
    hub_of,
)


def _stream(hub: Any, job: FakeJob, ping_seconds: float = 15.0) -> Any:
    return job_events(hub, cast(JobRecord, job), None, ping_seconds)


def test_a_stream_from_the_start_sends_the_first_id_a_stream_can_hold() -> None:
    """No Last-Event-ID: everything, from 0-1 (the smallest id Redis gives an entry) on."""
    stream = [(f"0-{n}", {"type": "metrics", "data": json.dumps({"n": n})}) for n in (1, 2)]
    stream += entries(1, 2, done_at=2)
    hub = hub_of(FakeEvents(stream))
    chunk = asyncio.run(drain(_stream(hub, FakeJob(terminal=True))))
    assert event_ids(chunk) == ["0-1", "0-2", "1-0", "2-0"]


def test_a_redis_error_ends_a_stream_cleanly_after_what_it_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis fails on the second backlog page: the client has the first page, the stream ends
    without an error (the response is under way: only an end is left to send), one log line."""

    class FailingSecondRead(FakeEvents):
        async def encoded_events_after(
            self, job_id: str, after: tuple[int, int], count: int
        ) -> EncodedPage:
            if self.reads:
                raise redis.exceptions.ConnectionError("Connection refused")
            return await super().encoded_events_after(job_id, after, count)

    total = BACKLOG_PAGE + 5
    hub = hub_of(FailingSecondRead(entries(1, total, done_at=total)))
    with caplog.at_level(logging.WARNING, logger="api.streaming.sse_stream"):
        chunk = asyncio.run(drain(_stream(hub, FakeJob(terminal=True))))
    assert event_ids(chunk) == [f"{n}-0" for n in range(1, BACKLOG_PAGE + 1)]
    assert [r.getMessage() for r in caplog.records] == [
        "event stream of job job ended by a Redis error: Connection refused"
    ]


def test_a_job_that_ended_between_its_backlog_and_the_look_at_it_ends_with_its_done() -> None:
    """The job was running when the stream opened and its backlog was read; it ended (wrote its
    `done`) before the stream looked at its record: the stream sends the rest of its history and
    ends, not waiting on a feed that will never hear from it again."""

    class EndingStore(FakeStore):
        async def get(self, job_id: str) -> FakeJob | None:
            self.events.stream += entries(4, 1, done_at=4)
            return FakeJob(terminal=True)

    events = FakeEvents(entries(1, 3))
    hub = hub_of(events, client=IdleRedis(), store=EndingStore(events))
    chunk = asyncio.run(asyncio.wait_for(drain(_stream(hub, FakeJob(terminal=False))), 5))
    assert event_ids(chunk) == ["1-0", "2-0", "3-0", "4-0"]
    assert chunk.count(b"event: done") == 1 and PING not in chunk


def test_first_pings_of_a_storm_are_spread_over_the_second_half_of_the_interval() -> None:
    """A reconnect storm's idle streams are pinged at random points between half the interval
    and the whole of it: not all in one pass of the loop, and not later than the interval."""
    ping_seconds = 0.8
    hub = hub_of(FakeEvents([]), client=IdleRedis(), job=FakeJob())

    async def first_ping() -> tuple[bytes, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        stream = _stream(hub, FakeJob(), ping_seconds)
        piece = cast(bytes, await anext(stream))
        elapsed = loop.time() - start
        await stream.aclose()
        return piece, elapsed

    async def storm() -> list[tuple[bytes, float]]:
        return await asyncio.gather(*(first_ping() for _ in range(100)))

    results = asyncio.run(storm())
    assert {piece for piece, _ in results} == {PING}
    times = sorted(elapsed for _, elapsed in results)
    # The lower bound is exact (the wait starts after the stream's own setup); the upper one
    # leaves 0.1 s of setup and scheduling to the 90th percentile.
    assert times[0] >= 0.5 * ping_seconds
    assert times[89] <= ping_seconds + 0.1
    assert times[-1] - times[0] >= 0.25 * ping_seconds
