"""The event hub's pieces without a server: ids, frame encoding, shared backlog reads, admission.

The integration tests (`tests/integration/test_sse_load.py`, `test_event_ids.py`) show the same
through real processes; these pin the mechanisms down: a storm reads each backlog page once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import subprocess
import sys
from typing import Any, cast

import pytest
import redis
from sse_starlette import ServerSentEvent

from api.events import BACKLOG_PAGE, EventHub, StreamLimitReached
from api.sse_frames import Batch, Turns, encode, frames_after, pieces
from api.sse_stream import _ended
from pdppo.settings import Settings
from pdppo.store import AsyncJobStore
from pdppo.store.events import EncodedPage, EventIdError, parse_event_id

Entry = tuple[str, dict[str, str]]


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


@pytest.mark.parametrize(
    "entry",
    [
        ("1-0", {"type": "metrics", "data": json.dumps({"step": 1, "m": {"a": 0.5}})}),
        ("2-7", {"type": "log", "data": json.dumps({"message": "two\nlines"})}),
        ("3-0", {"type": "log", "data": "raw\r\ntext"}),  # not JSON: the slow path
        ("4-0", {"data": "{}"}),  # no type: a log
    ],
)
def test_encode_writes_what_server_sent_event_writes(entry: Entry) -> None:
    entry_id, fields = entry
    event = fields.get("type", "log")
    expected = ServerSentEvent(data=fields["data"], event=event, id=entry_id).encode()
    assert encode(entry).data == expected


def entries(first: int, count: int, done_at: int | None = None) -> list[Entry]:
    out: list[Entry] = []
    for n in range(first, first + count):
        kind = "done" if n == done_at else "metrics"
        out.append((f"{n}-0", {"type": kind, "data": json.dumps({"step": n})}))
    return out


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


def test_pieces_are_bounded_and_lose_nothing() -> None:
    big = b"x" * (200 * 1024 + 17)
    assert b"".join(bytes(p) for p in pieces(big)) == big
    assert max(len(p) for p in pieces(big)) <= 64 * 1024
    assert list(pieces(b"")) == []


class FakeEvents:
    """The store's stream reads over a list, counting XRANGEs; each read yields to the loop."""

    def __init__(self, stream: list[Entry]) -> None:
        self.stream = stream
        self.reads = 0

    async def encoded_events_after(
        self, job_id: str, after: tuple[int, int], count: int
    ) -> EncodedPage:
        self.reads += 1
        await asyncio.sleep(0.01)
        later = [e for e in self.stream if parse_event_id(e[0]) > after][:count]
        batch = Batch.of(later)
        last = batch.frames[-1].id if batch.frames else None
        return EncodedPage(
            batch.chunk, f"{last[0]}-{last[1]}" if last else None, len(later), batch.done
        )

    async def last_event_of_type(self, job_id: str, event_type: str) -> Entry | None:
        return next((e for e in reversed(self.stream) if e[1]["type"] == event_type), None)


class FakeStore:
    def __init__(self, stream: list[Entry]) -> None:
        self.events = FakeEvents(stream)

    async def last_event_id(self, job_id: str) -> str:
        return self.events.stream[-1][0] if self.events.stream else "0-0"


def hub_of(store: FakeStore, **limits: int) -> EventHub:
    """A hub over `store`, with the settings' default limits unless `limits` says otherwise."""
    settings = Settings()
    return EventHub(
        cast(Any, None),
        cast(AsyncJobStore, store),
        queue_size=limits.get("queue_size", settings.sse_queue_size),
        max_streams=limits.get("max_streams", settings.sse_max_streams),
        max_streams_per_tenant=limits.get(
            "max_streams_per_tenant", settings.sse_max_streams_per_tenant
        ),
    )


def hub_over(stream: list[Entry], **limits: int) -> tuple[EventHub, FakeEvents]:
    store = FakeStore(stream)
    return hub_of(store, **limits), store.events


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


def hub_reading(events: CountingEvents) -> EventHub:
    store = FakeStore([])
    store.events = events
    return hub_of(store)


async def replay(hub: EventHub, job: str) -> bytes:
    return b"".join([page.chunk async for page in hub.backlog(job, (0, 0))])


def test_backlog_reads_are_four_at_a_time_per_process() -> None:
    """Twelve streams replaying twelve jobs (nothing to share): their reads hold four of the
    streams' Redis connections at most, and do use four."""
    events = CountingEvents(seconds=0.03)
    hub = hub_reading(events)

    async def storm() -> list[bytes]:
        return await asyncio.gather(*(replay(hub, f"job{n}") for n in range(12)))

    assert asyncio.run(storm()) == [b"x" * 10] * 12
    assert (events.reads, events.most_in_flight) == (12, 4)


def test_the_backlog_cache_keeps_the_newest_32_mib_of_pages() -> None:
    """Pages that cannot change are kept for streams that come a little later, up to 32 MiB:
    of forty 1 MiB pages read one after another, the newest 32 are shared, the older ones
    read again."""
    events = CountingEvents(page_bytes=2**20)
    hub = hub_reading(events)

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


def test_a_storms_end_tidies_memory_once_2_seconds_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 streams open at once, then down to a quarter of them: one tidy-up (a full GC and
    malloc_trim) 2 s later, and none for the streams that end after it."""
    import api.events

    hub, _ = hub_over([])
    tidied: list[float] = []

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(api.events, "_tidy", lambda: tidied.append(loop.time()))
        slots = [hub.admit(f"tenant{n % 7}") for n in range(200)]
        for slot in slots[:149]:
            slot.release()
        # 51 open: more than a quarter of the peak (a tidy-up scheduled by one of those
        # releases would come 0.5 s early, below)
        await asyncio.sleep(0.5)
        slots[149].release()
        ended = loop.time()
        await asyncio.sleep(0.5)  # a tidy-up at the next release would come 2.5 s after `ended`
        for slot in slots[150:]:
            slot.release()
        await asyncio.sleep(1.9)
        return ended

    ended = asyncio.run(scenario())
    assert len(tidied) == 1 and 2.0 <= tidied[0] - ended < 2.4, [t - ended for t in tidied]


def test_the_redis_driver_info_is_resolved_once() -> None:
    """Every pool gets the same object: redis-py would otherwise read its own package metadata
    for each connection it opens, on the event loop."""
    from api.events import redis_driver_info

    assert redis_driver_info() is redis_driver_info()


def test_admission_bounds_streams_per_tenant_and_in_total() -> None:
    hub, _ = hub_over([], max_streams=3, max_streams_per_tenant=2)
    a1, a2 = hub.admit("alice"), hub.admit("alice")
    with pytest.raises(StreamLimitReached) as refused:
        hub.admit("alice")
    assert refused.value.limit == "tenant" and 1 <= refused.value.retry_after <= 60
    b1 = hub.admit("bob")
    with pytest.raises(StreamLimitReached) as full:
        hub.admit("carol")
    assert full.value.limit == "total"
    a1.release()
    a1.release()  # idempotent: a slot is given back once
    hub.admit("carol")
    with pytest.raises(StreamLimitReached):
        hub.admit("bob")
    a2.release()
    b1.release()
    assert hub.admit("bob") is not None
    # a tenant that gave its streams back has its limit again, neither more nor less
    wide = hub_over([], max_streams=10, max_streams_per_tenant=2)[0]
    for _ in range(3):
        slots = [wide.admit("alice"), wide.admit("alice")]
        with pytest.raises(StreamLimitReached, match="tenant"):
            wide.admit("alice")
        for slot in slots:
            slot.release()
    # one of two given back: one more, and no more
    kept = wide.admit("bob")
    wide.admit("bob").release()
    wide.admit("bob")
    with pytest.raises(StreamLimitReached, match="tenant"):
        wide.admit("bob")
    kept.release()


def test_a_refused_streams_retry_after_is_drawn_from_5_to_15_seconds() -> None:
    """Refused clients come back spread over 5-15 s, not as one herd: every whole second of
    the range is drawn, and none outside it."""
    hub, _ = hub_over([], max_streams=1)
    hub.admit("alice")
    random.seed(0)
    drawn: set[int] = set()
    for _ in range(300):
        with pytest.raises(StreamLimitReached) as refused:
            hub.admit("bob")
        drawn.add(refused.value.retry_after)
    assert drawn == set(range(5, 16))


def test_freezing_the_startup_heap_makes_full_collections_10x_rarer_only() -> None:
    """In a fresh interpreter (the thresholds are process-wide): the young and middle
    generations keep CPython's thresholds (a raised young one cost submissions throughput), the
    full pass comes 10x later, and what was alive is frozen out of the collector's sight."""
    code = (
        "import gc; before = gc.get_threshold()\n"
        "from api.events import freeze_startup_heap; freeze_startup_heap()\n"
        "print(before, gc.get_threshold(), gc.get_freeze_count() > 10000)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "(700, 10, 10) (700, 10, 100) True"


def test_turns_bound_holders_and_a_stuck_holder_loses_its_turn() -> None:
    async def scenario() -> list[str]:
        turns = Turns(2, lease=0.05)
        order: list[str] = []
        stuck = asyncio.Event()

        async def hold(name: str, until: asyncio.Event | None) -> None:
            async with turns.turn():
                order.append(f"{name} in")
                if until is not None:
                    await until.wait()  # as a write waiting on a client that does not read
                else:
                    await asyncio.sleep(0.01)
            order.append(f"{name} out")

        tasks = [asyncio.create_task(hold("a", stuck)), asyncio.create_task(hold("b", stuck))]
        await asyncio.sleep(0)
        third = asyncio.create_task(hold("c", None))
        await asyncio.sleep(0.02)
        assert "c in" not in order  # two holders at most...
        await asyncio.wait_for(third, 1)  # ...but stuck ones give their turns up after the lease
        stuck.set()
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(scenario())
    assert order.index("c in") < order.index("a out")


def test_the_hubs_replay_turns_are_16_wide_and_leased_for_50_ms() -> None:
    """Sixteen backlog writes stuck on clients that do not read: a seventeenth gets its turn
    when their 50 ms leases run out, not before and not a second later."""
    hub, _ = hub_over([])

    async def scenario() -> float:
        stuck = asyncio.Event()
        entered = [0]

        async def hold() -> None:
            async with hub.turns.turn():
                entered[0] += 1
                await stuck.wait()

        holders = [asyncio.create_task(hold()) for _ in range(16)]
        await asyncio.sleep(0)
        assert entered[0] == 16
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with hub.turns.turn():
            waited = loop.time() - start
        stuck.set()
        await asyncio.gather(*holders)
        return waited

    assert 0.045 <= asyncio.run(scenario()) < 0.5


def test_a_subscriber_holds_at_most_its_limit_but_always_one_batch() -> None:
    """A slow subscriber is cut off (`put` is False) once a batch would take it past `limit`
    events behind; a batch larger than the limit still goes to one that is caught up, or a
    burst would cut off every subscriber, fast ones too."""
    from api.events import Subscriber

    slow = Subscriber(limit=5, until=(0, 0))
    assert slow.put(Batch.of(entries(1, 3)))
    assert slow.put(Batch.of(entries(4, 2)))  # 5 behind: at the limit, not past it
    assert not slow.put(Batch.of(entries(6, 1)))
    assert slow.pending == 5 and [len(b.frames) for b in slow.batches] == [3, 2]
    caught_up = Subscriber(limit=5, until=(0, 0))
    assert caught_up.put(Batch.of(entries(1, 8)))
    assert not caught_up.put(Batch.of(entries(9, 1)))
    # what it has sent no longer counts: caught up again, for a large batch and then a limit
    assert [len(b.frames) for b in asyncio.run(slow.take()) or []] == [3, 2]
    assert slow.put(Batch.of(entries(6, 8)))
    asyncio.run(slow.take())
    assert slow.put(Batch.of(entries(14, 2))) and slow.put(Batch.of(entries(16, 3)))
    assert not slow.put(Batch.of(entries(19, 1)))


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
        batch = Batch.of(later)
        last = batch.frames[-1].id if batch.frames else None
        return EncodedPage(
            batch.chunk, f"{last[0]}-{last[1]}" if last else None, len(later), batch.done
        )


def event_ids(chunk: bytes) -> list[str]:
    return [line[4:] for line in chunk.decode().splitlines() if line.startswith("id: ")]


async def drain(stream: Any) -> bytes:
    return b"".join([bytes(piece) async for piece in stream])


def test_a_stream_that_shared_a_read_from_before_the_job_ended_reads_on_to_its_done() -> None:
    """The job ended between the read this stream joined and the stream's own look at it: the
    shared page stops short of the `done`, so the rest is read afresh, over several pages."""
    total = BACKLOG_PAGE + 13
    store = FakeStore(entries(1, 3))
    events = store.events = GatedEvents(store.events.stream)
    hub = hub_of(store)

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


def test_an_ended_jobs_done_goes_to_a_client_ahead_of_it_but_not_to_one_that_has_it() -> None:
    hub, _ = hub_over(entries(1, 5, done_at=5))
    has_it = asyncio.run(drain(_ended(hub, "job", (5, 0), (5, 0))))
    assert has_it == b""
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

    store = FakeStore(entries(1, 2, done_at=2))
    store.events = events = FailingOnce(store.events.stream)
    hub = hub_of(store)

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

    store = FakeStore(entries(1, 2, done_at=2))
    store.events = events = CountingLookups(store.events.stream)
    hub = hub_of(store)

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


class OutageRedis:
    """A streams' client whose XREADs fail or answer as `script` says, in turn ("error",
    "empty"); past its end, every read waits until cancelled."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.reads = 0

    def register_script(self, source: str) -> None:  # the hub's backlog reads: none here
        return None

    async def xread(self, streams: dict[str, str], count: int, block: int) -> list[Any]:
        self.reads += 1
        if not self.script:
            await asyncio.Event().wait()
        if self.script.pop(0) == "error":
            raise redis.ConnectionError("Connection refused")
        return []


def test_a_feed_retries_redis_errors_paced_and_says_so_once_per_outage(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Twelve failed reads, one that works, two more failures: the retries wait 0.5 s more at
    each failure up to 5 s, and start again at 0.5 s after Redis came back; each outage is one
    warning (the retries are debug lines) and its end one info line."""
    import api.events

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    outage = OutageRedis(["error"] * 12 + ["empty"] + ["error"] * 2)
    store = FakeStore([])
    hub = EventHub(
        cast(Any, None), cast(AsyncJobStore, store), stream_client=cast(Any, outage),
        queue_size=16, max_streams=10, max_streams_per_tenant=10,
    )  # fmt: skip

    async def scenario() -> None:
        monkeypatch.setattr(api.events.asyncio, "sleep", sleep)
        async with hub.subscribe("job"):
            while outage.script:
                await real_sleep(0.001)
            await real_sleep(0.01)

    with caplog.at_level(logging.DEBUG, logger="api.events"):
        asyncio.run(scenario())
    assert slept == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.0, 5.0, 0.5, 1.0]
    feed_lines = [(r.levelname, r.getMessage()) for r in caplog.records if "sse feed" in r.msg]
    assert [level for level, _ in feed_lines] == ["WARNING"] + ["DEBUG"] * 11 + [
        "INFO",
        "WARNING",
        "DEBUG",
    ]
    assert feed_lines[12][1] == "sse feed job: Redis is back after 12 errors"
    assert outage.reads == 16
