"""The event hub's limits without a server: admission (per tenant, in total, Retry-After), turns
for replay writes, a subscriber's bound, a feed's retries, and the memory and GC settings a
storm of streams needs. The backlog is in test_sse_backlog.py, frames in test_sse_frames.py."""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
from typing import Any

import pytest
import redis

from api.streaming.events import StreamLimitReached
from api.streaming.sse_frames import Batch, Turns
from tests.api.sse_fakes import FakeEvents, entries, hub_of, hub_over


def test_a_storms_end_tidies_memory_once_2_seconds_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 streams open at once, then down to a quarter of them: one tidy-up (a full GC and
    malloc_trim) 2 s later, and none for the streams that end after it."""
    import api.streaming.events

    hub, _ = hub_over([])
    tidied: list[float] = []

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(api.streaming.events, "_tidy", lambda: tidied.append(loop.time()))
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
    from api.streaming.events import redis_driver_info

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
        "from api.streaming.events import freeze_startup_heap; freeze_startup_heap()\n"
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
        # A turn taken back at its lease's end is not given back again when its holder ends:
        # still two holders at most.
        stuck.clear()
        later = [asyncio.create_task(hold(name, stuck)) for name in "def"]
        for _ in range(3):  # each takes its turn at its first step, or waits
            await asyncio.sleep(0)
        assert sum(f"{name} in" in order for name in "def") == 2
        stuck.set()
        await asyncio.gather(*later)
        return order

    order = asyncio.run(scenario())
    assert order.index("c in") < order.index("a out")


def test_the_hubs_replay_turns_are_16_wide_and_leased_for_50_ms() -> None:
    """Sixteen backlog writes stuck on clients that do not read: a seventeenth gets its turn
    when their 50 ms leases run out, not before and not a second later. (Timed from the first
    holder's turn, when its lease starts: from after the holders, a busy machine's delay in
    between shortened the wait below 45 ms.)"""
    hub, _ = hub_over([])

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        stuck = asyncio.Event()
        entered: list[float] = []

        async def hold() -> None:
            async with hub.turns.turn():
                entered.append(loop.time())
                await stuck.wait()

        holders = [asyncio.create_task(hold()) for _ in range(16)]
        await asyncio.sleep(0)
        assert len(entered) == 16
        async with hub.turns.turn():
            waited = loop.time() - entered[0]
        stuck.set()
        await asyncio.gather(*holders)
        return waited

    assert 0.045 <= asyncio.run(scenario()) < 0.5


def test_a_subscriber_holds_at_most_its_limit_but_always_one_batch() -> None:
    """A slow subscriber is cut off (`put` is False) once a batch would take it past `limit`
    events behind; a batch larger than the limit still goes to one that is caught up, or a
    burst would cut off every subscriber, fast ones too."""
    from api.streaming.events import Subscriber

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
    import api.streaming.events

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    outage = OutageRedis(["error"] * 12 + ["empty"] + ["error"] * 2)
    hub = hub_of(FakeEvents([]), stream_client=outage)

    async def scenario() -> None:
        monkeypatch.setattr(api.streaming.events.asyncio, "sleep", sleep)
        async with hub.subscribe("job"):
            while outage.script:
                await real_sleep(0.001)
            await real_sleep(0.01)

    with caplog.at_level(logging.DEBUG, logger="api.streaming.events"):
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


class BrokenReplyRedis(OutageRedis):
    """A streams' client whose first XREAD returns an entry that cannot be encoded (an id that
    is not an event id): what a bug in the feed's loop looks like from a subscriber."""

    async def xread(self, streams: dict[str, str], count: int, block: int) -> list[Any]:
        self.reads += 1
        if self.reads == 1:
            return [("events:job", [("not-an-id", {"type": "log", "data": "{}"})])]
        await asyncio.Event().wait()
        return []


def test_a_feed_that_fails_ends_its_subscribers_streams_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its subscribers' streams end (their clients reconnect with Last-Event-ID), with the error
    logged: left open, they would wait on a feed that is gone, silent for good."""
    hub = hub_of(FakeEvents([]), stream_client=BrokenReplyRedis([]))

    async def scenario() -> list[list[Batch] | None]:
        async with hub.subscribe("job") as first, hub.subscribe("job") as second:
            return await asyncio.wait_for(asyncio.gather(first.take(), second.take()), 5)

    with caplog.at_level(logging.ERROR, logger="api.streaming.events"):
        assert asyncio.run(scenario()) == [None, None]
    failed = [
        r for r in caplog.records if r.getMessage() == "sse feed job failed; closing its streams"
    ]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert "not an event id" in str(failed[0].exc_info[1])
