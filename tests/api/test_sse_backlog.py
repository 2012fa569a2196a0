"""The event hub's backlog without a server: shared reads (a storm reads each page once), four
reads at a time, the cache of pages that cannot change, an ended job's history and its `done`.

The integration tests (`tests/integration/test_sse_load.py`, `test_event_ids.py`) show the same
through real processes."""

from __future__ import annotations

import asyncio

import pytest

from api.streaming.events import BACKLOG_PAGE, EventHub
from api.streaming.sse_stream import _ended
from pdppo.store.jobs.events import EncodedPage, parse_event_id
from tests.api.sse_fakes import (
    Entry,
    FakeEvents,
    drain,
    entries,
    event_ids,
    hub_of,
    hub_over,
    page_of,
)


def test_a_storm_reads_each_backlog_page_once() -> None:
    total = 2 * BACKLOG_PAGE + 500
    hub, events = hub_over(entries(1, total, done_at=total))

    async def replay() -> bytes:
        parts = [p.chunk async for p in hub.backlog("job", (0, 0))]
        return b"".join(parts)

    async def storm() -> list[bytes]:
        return await asyncio.gather(*(replay() for _ in range(200)))

    chunks = asyncio.run(storm())
    assert len(set(chunks)) == 1 and chunks[0].count(b"event: ") == total
    assert events.reads == 3  # three pages, each read once for all 200


class CountingEvents(FakeEvents):
    """Reads that take `seconds` and record how many were in flight at once; every job's
    stream is one page of `page_bytes` ending with `done` (a page kept in the cache)."""

    def __init__(self, seconds: float = 0.0, page_bytes: int = 10) -> None:
        super().__init__([])
        self.seconds, self.page_bytes = seconds, page_bytes
        self.in_flight = self.most_in_flight = 0

    async def encoded_events_after(
        self, job_id: str, after: tuple[int, int], count: int
    ) -> EncodedPage:
        self.reads += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.seconds)
        self.in_flight -= 1
        return EncodedPage(b"x" * self.page_bytes, "1-0", 1, True)


async def replay(hub: EventHub, job: str) -> bytes:
    return b"".join([page.chunk async for page in hub.backlog(job, (0, 0))])


def test_backlog_reads_are_four_at_a_time_per_process() -> None:
    """Twelve streams replaying twelve jobs (nothing to share): their reads hold four of the
    streams' Redis connections at most, and do use four."""
    events = CountingEvents(seconds=0.03)
    hub = hub_of(events)

    async def storm() -> list[bytes]:
        return await asyncio.gather(*(replay(hub, f"job{n}") for n in range(12)))

    assert asyncio.run(storm()) == [b"x" * 10] * 12
    assert (events.reads, events.most_in_flight) == (12, 4)


def test_the_backlog_cache_keeps_the_newest_32_mib_of_pages() -> None:
    """Pages that cannot change are kept for streams that come a little later, up to 32 MiB:
    of forty 1 MiB pages read one after another, the newest 32 are shared, the older ones
    read again."""
    events = CountingEvents(page_bytes=2**20)
    hub = hub_of(events)

    async def scenario() -> tuple[int, int]:
        for n in range(40):
            await replay(hub, f"job{n}")
        kept_reads = events.reads
        for n in range(8, 40):
            await replay(hub, f"job{n}")  # shared: no read
        assert events.reads == kept_reads
        await replay(hub, "job7")  # the newest evicted
        return kept_reads, events.reads

    assert asyncio.run(scenario()) == (40, 41)
    assert len(hub._cache) == 32 and hub._cache_bytes == 32 * 2**20


class GatedEvents(FakeEvents):
    """Reads that take what the stream holds when they are issued and answer when the gate
    opens: a read shared with a subscriber that came later, from before the job moved on."""

    def __init__(self, stream: list[Entry]) -> None:
        super().__init__(stream)
        self.gate = asyncio.Event()

    async def encoded_events_after(
        self, job_id: str, after: tuple[int, int], count: int
    ) -> EncodedPage:
        self.reads += 1
        later = [e for e in self.stream if parse_event_id(e[0]) > after][:count]
        await self.gate.wait()
        return page_of(later)


def test_a_stream_that_shared_a_read_from_before_the_job_ended_reads_on_to_its_done() -> None:
    """The job ended between the read this stream joined and the stream's own look at it: the
    shared page stops short of the `done`, so the rest is read afresh, over several pages."""
    total = BACKLOG_PAGE + 13
    events = GatedEvents(entries(1, 3))
    hub = hub_of(events)

    async def scenario() -> bytes:
        pages = hub.backlog("job", (0, 0))  # a running job's subscriber reads its backlog
        early = asyncio.create_task(drain(page.chunk async for page in pages))
        await asyncio.sleep(0.01)
        events.stream += entries(4, total - 3, done_at=total)  # then the job went on and ended
        late = asyncio.create_task(drain(_ended(hub, "job", (0, 0), (0, 0))))
        await asyncio.sleep(0.01)
        events.gate.set()
        await early
        return await late

    chunk = asyncio.run(scenario())
    assert event_ids(chunk) == [f"{n}-0" for n in range(1, total + 1)]
    assert chunk.count(b"event: done") == 1 and chunk.rstrip().endswith(b'{"step": %d}' % total)


def test_a_stream_reading_on_to_its_done_does_not_join_a_read_from_before_the_job_ended() -> None:
    """As above, and another subscriber's read from where this stream goes on is in flight,
    issued before the job ended (it will answer "nothing more"): the stream reads afresh,
    or it would end without the job's `done`."""

    class HeldEvents(FakeEvents):
        """Reads from an id in `hold` take what the stream holds when issued and answer when
        that id's event is set."""

        def __init__(self, stream: list[Entry]) -> None:
            super().__init__(stream)
            self.hold: dict[tuple[int, int], asyncio.Event] = {}

        async def encoded_events_after(
            self, job_id: str, after: tuple[int, int], count: int
        ) -> EncodedPage:
            gate = self.hold.get(after)
            if gate is None:
                return await super().encoded_events_after(job_id, after, count)
            self.reads += 1
            later = [e for e in self.stream if parse_event_id(e[0]) > after][:count]
            await gate.wait()
            return page_of(later)

    events = HeldEvents(entries(1, 3))
    hub = hub_of(events)

    async def scenario() -> bytes:
        events.hold = {(0, 0): asyncio.Event(), (3, 0): asyncio.Event()}
        first = asyncio.create_task(drain(page.chunk async for page in hub.backlog("job", (0, 0))))
        ahead = asyncio.create_task(drain(page.chunk async for page in hub.backlog("job", (3, 0))))
        await asyncio.sleep(0.01)
        events.stream += entries(4, 2, done_at=5)  # the job ends
        stale = events.hold.pop((3, 0))  # `ahead`'s read stays in flight
        late = asyncio.create_task(drain(_ended(hub, "job", (0, 0), (0, 0))))
        await asyncio.sleep(0.01)
        events.hold[(0, 0)].set()
        try:
            return await asyncio.wait_for(late, 2)
        finally:
            stale.set()
            await asyncio.gather(first, ahead)

    chunk = asyncio.run(scenario())
    assert event_ids(chunk) == ["1-0", "2-0", "3-0", "4-0", "5-0"]


def test_an_ended_jobs_done_goes_to_a_client_ahead_of_it_but_not_to_one_that_has_it() -> None:
    hub, events = hub_over(entries(1, 5, done_at=5))
    has_it = asyncio.run(drain(_ended(hub, "job", (5, 0), (5, 0))))
    assert has_it == b"" and events.reads == 1  # nothing after its id: nothing more to read
    ahead = asyncio.run(drain(_ended(hub, "job", (9, 0), (9, 0))))
    assert event_ids(ahead) == ["5-0"] and ahead.count(b"event: done") == 1
    behind = asyncio.run(drain(_ended(hub, "job", (3, 0), (3, 0))))
    assert event_ids(behind) == ["4-0", "5-0"]


def test_a_stream_without_a_done_ends_after_its_history() -> None:
    """A terminal job whose `done` is not in the stream (written after the status, or trimmed):
    the history, then the end of the stream, never an error."""
    hub, _ = hub_over(entries(1, 3))
    assert asyncio.run(hub.done_frame("job")) is None
    assert event_ids(asyncio.run(drain(_ended(hub, "job", (0, 0), (0, 0))))) == [
        "1-0",
        "2-0",
        "3-0",
    ]


def test_an_ended_jobs_empty_stream_ends_at_once() -> None:
    """A terminal job whose stream holds nothing (expired or trimmed away): one read, then the
    end of the stream, from the start or from any id."""
    hub, events = hub_over([])

    async def replay(after: tuple[int, int]) -> bytes:
        return await asyncio.wait_for(drain(_ended(hub, "job", after, after)), 5)

    assert asyncio.run(replay((0, 0))) == b"" and events.reads == 1
    assert asyncio.run(replay((7, 0))) == b"" and events.reads == 2


def test_a_page_that_can_still_change_is_read_again_by_the_next_subscriber() -> None:
    """A running job's last page (neither full nor ending with `done`) is shared only by the
    subscribers waiting on its read: one that comes after the read gets the events written
    since, not the old page, and nothing is left in flight or kept."""
    hub, events = hub_over(entries(1, 3))

    async def pages(until: tuple[int, int]) -> list[list[str]]:
        return [event_ids(page.chunk) async for page in hub.backlog("job", (0, 0), until)]

    assert asyncio.run(pages((3, 0))) == [["1-0", "2-0", "3-0"]]
    events.stream += entries(4, 2)
    assert asyncio.run(pages((5, 0))) == [["1-0", "2-0", "3-0", "4-0", "5-0"]]
    assert events.reads == 2 and not hub._inflight and not hub._cache


def test_a_failed_backlog_read_is_neither_kept_nor_reported_twice() -> None:
    """A read that fails (Redis down) fails its subscribers' streams, once: nothing is kept
    of it, the event loop is handed no second error, and the next subscriber reads again."""

    class FailingOnce(FakeEvents):
        async def encoded_events_after(
            self, job_id: str, after: tuple[int, int], count: int
        ) -> EncodedPage:
            if not self.reads:
                self.reads += 1
                raise ConnectionError("Redis is down")
            return await super().encoded_events_after(job_id, after, count)

    events = FailingOnce(entries(1, 2, done_at=2))
    hub = hub_of(events)

    async def scenario() -> tuple[list[object], list[str]]:
        unhandled: list[object] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unhandled.append(ctx))
        with pytest.raises(ConnectionError):
            [page async for page in hub.backlog("job", (0, 0))]
        await asyncio.sleep(0.01)  # the read's done callbacks have run
        ids = [i async for page in hub.backlog("job", (0, 0)) for i in event_ids(page.chunk)]
        return unhandled, ids

    assert asyncio.run(scenario()) == ([], ["1-0", "2-0"])
    assert events.reads == 2 and not hub._inflight


def test_the_done_frames_of_the_1024_latest_ended_jobs_are_kept() -> None:
    """An ended job's `done` never changes: it is looked up once and kept, for the 1024 jobs
    looked up last (the oldest lookup goes first)."""

    class CountingLookups(FakeEvents):
        lookups = 0

        async def last_event_of_type(self, job_id: str, event_type: str) -> Entry | None:
            self.lookups += 1
            return await super().last_event_of_type(job_id, event_type)

    events = CountingLookups(entries(1, 2, done_at=2))
    hub = hub_of(events)

    async def ask(*jobs: int) -> None:
        for n in jobs:
            frame = await hub.done_frame(f"job{n}")
            assert frame is not None and frame.event == "done"

    asyncio.run(ask(*range(1025)))
    assert events.lookups == 1025
    asyncio.run(ask(*range(1, 1025)))  # the latest 1024: kept
    assert events.lookups == 1025
    asyncio.run(ask(0))  # the first: gone
    assert events.lookups == 1026 and len(hub._done) == 1024
