"""Server-sent events for a job: its backlog in shared pages, then live events from one reader.

The load that hurts is not live delivery but a reconnect storm: a thousand clients replaying a
job's backlog at once (after a deploy, a network blip). Read per subscriber and written event by
event, that was a thousand Redis connections and millions of small writes, and the event loop had
no time left for anything else (health checks took seconds). So:

- Admission (`api.http.tenant_slots`): an API process holds at most `sse_max_streams` streams,
  and a tenant at most `sse_max_streams_per_tenant`; past either the route answers 429 with a
  Retry-After drawn from RETRY_AFTER_SECONDS (so refused clients do not come back as one herd).
  A stream holds its slot from admission to the end of its response, however that ends.
- Backlog: pages of BACKLOG_PAGE entries, each read by one script that returns the page already
  encoded as SSE frames (`AsyncEventStore.encoded_events_after`: redis-py would spend 50-150 ms
  of the loop parsing a 1000-entry XRANGE). Subscribers replaying from the same id at the same
  time wait on the same read (single flight), and a page that can no longer change (full, or
  ending with `done`) is kept a while: a storm reads each page once, not once per subscriber.
  Reads go over the streams' own connections (not the requests' pool), at most BACKLOG_READS
  at a time. A page goes out in writes of WRITE_BYTES, and subscribers take turns (`Turns`) to
  fetch and write, so that no pass of the event loop runs a thousand writes back to back, and
  a subscriber's share of memory is one write, not its backlog.
- Live: each job with subscribers has one feed, an XREAD BLOCK loop on the streams' pool (its
  socket timeout is the block time plus a reply's, so an idle stream never times out), that
  encodes each reply once and hands the batch to every subscriber, which sends what it has in
  one write. A subscriber joins the feed first and reads the backlog after, up to at least the
  feed's cursor when it joined, so every entry is in one or the other (duplicates are dropped by
  id): no gap, no duplicate. A subscriber more than `queue_size` events behind is cut off; its
  client reconnects with Last-Event-ID. An ended job's stream needs no feed at all.
- Ids: a client's id comes checked (`parse_event_id`: 400 otherwise). An id past the stream's
  newest entry means the client saw events this server does not have (a Redis restored from an
  older backup, an id from another deployment): it gets the events that come after its id, and
  the job's `done` whatever that one's id, so that its stream still ends with the job. Replaying
  from the start instead would hand it again, under ids older than its own, events it has
  already acted on, and a client that drops ids below its last would drop the `done` too.
- Memory and pauses: see `freeze_startup_heap` (GC) and `_tidy` (after a storm).

Frames, batches and turns are in `api/streaming/sse_frames.py`; one client's stream in
`api/streaming/sse_stream.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

import redis.asyncio as aredis
from prometheus_client import Counter
from redis.driver_info import DriverInfo

from api.http.observability import SSE_FEEDS, SSE_SUBSCRIBERS
from api.http.tenant_slots import LimitReached, Slot, TenantSlots
from api.streaming.cancel import cancel_until_done
from api.streaming.sse_frames import Batch, Entry, Frame, Page, Turns, encode
from pdppo.settings import Settings
from pdppo.store import AsyncJobStore, events_key
from pdppo.store.jobs.events import AsyncEventStore, EventId, parse_event_id

log = logging.getLogger(__name__)
BLOCK_MS = 5000  # a feed's XREAD BLOCK; its connection's socket timeout is this plus the reply's
BACKLOG_PAGE = 1000  # entries per backlog read
FEED_COUNT = 100  # entries per feed read: redis-py parses a reply in one go, on the event loop
BACKLOG_READS = 4  # backlog reads in flight at once, per API process
BACKLOG_CACHE_BYTES = 32 * 2**20  # encoded pages kept for subscribers that come a little later
BACKLOG_CACHE_SECONDS = 30.0
REPLAY_WRITERS = 16  # backlog writes in progress at once, per API process
REPLAY_TURN_SECONDS = 0.05  # longest a write holds its turn (a slow client's send waits longer)
GC_THRESHOLDS = (700, 10, 100)  # CPython's, but full passes 10x rarer: `freeze_startup_heap`
RETRY_AFTER_SECONDS = (5, 15)  # a refused stream's Retry-After, drawn per answer
DONE_FRAMES_KEPT = 1024
STORM_STREAMS = 200  # this many streams at once, then a quarter of them: memory is tidied up
TIDY_DELAY_SECONDS = 2.0

SSE_REFUSED = Counter(
    "pdppo_sse_streams_refused_total",
    "Event streams answered 429, by the limit they hit",
    ["limit"],
)
SSE_BACKLOG_PAGES = Counter(
    "pdppo_sse_backlog_pages_total",
    "Backlog pages sent to subscribers, by where they came from",
    ["source"],  # read: an XRANGE of its own; shared: another subscriber's read or the cache
)


def freeze_startup_heap() -> None:
    """Moves every object alive now out of the cyclic GC's sight (`gc.freeze`) and makes full
    collections rarer (GC_THRESHOLDS); call once, at the end of start-up.

    The API imports torch (budgets, specs): ~250k long-lived objects that every full collection
    walks again, and a storm of streams allocates fast enough to trigger several, each of which
    stopped the event loop for 100-900 ms with 1000 streams on a 2-core machine (measured with
    gc.callbacks). Frozen, the start-up heap is never walked; requests' objects are collected as
    before, but a full pass comes after 100 middle-generation passes instead of 10 (and after a
    storm, from `_tidy`). The young generation keeps its threshold: raised to 10,000, it cost
    submissions a fifth of their throughput (bench/api_load.py)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _tidy() -> None:
    """After a storm: one full collection (rare otherwise, see GC_THRESHOLDS) for the cycles its
    streams left, then glibc's `malloc_trim`, which hands the freed heap back to the system
    (glibc keeps it otherwise, and the process's RSS stays at the storm's peak)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@functools.cache
def redis_driver_info() -> DriverInfo:
    """What a new Redis connection reports with CLIENT SETINFO, resolved once. Left to itself,
    redis-py looks its own version up in the installed packages' metadata for every connection
    it opens: 5-10 ms of file reads blocking the event loop each, dozens in a row when a burst
    of requests fills the pool (pass it as `driver_info=` to every pool)."""
    return DriverInfo()


StreamLimitReached = LimitReached
"""Refused: `limit` ("tenant" or "total") is reached, at `value` streams."""


class Subscriber:
    """Batches a feed handed over and the subscriber has not sent yet, at most `limit` events."""

    def __init__(self, limit: int, until: EventId) -> None:
        self.limit = limit
        # The feed's cursor when it joined: the feed hands over what comes after, so the
        # backlog must reach at least this far.
        self.until = until
        self.batches: deque[Batch] = deque()
        self.pending = 0
        self.closed = False
        self._wake = asyncio.Event()

    def put(self, batch: Batch) -> bool:
        """False when the subscriber is `limit` events behind (one batch always fits)."""
        if self.pending and self.pending + len(batch.frames) > self.limit:
            return False
        self.batches.append(batch)
        self.pending += len(batch.frames)
        self._wake.set()
        return True

    def close(self) -> None:
        """Ends the stream after what it holds; its client resumes from the last id it got."""
        self.closed = True
        self._wake.set()

    async def take(self) -> list[Batch] | None:
        """Every batch waiting (one write for all of them), or None once closed and empty."""
        while not self.batches:
            if self.closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        batches = list(self.batches)
        self.batches.clear()
        self.pending = 0
        return batches


@dataclass(eq=False)
class Feed:
    job_id: str
    cursor: str
    subscribers: set[Subscriber] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    finished: bool = False


class EventHub:
    """The API process's event streams: admission, shared backlog pages and one feed per job."""

    def __init__(
        self,
        client: aredis.Redis,
        store: AsyncJobStore,
        *,
        stream_client: aredis.Redis | None = None,
        queue_size: int,
        max_streams: int,
        max_streams_per_tenant: int,
    ) -> None:
        self.redis = client
        self.stream_redis = stream_client or client
        self._owns_stream_client = stream_client is not None
        self.store = store
        # Backlog reads go over the streams' connections too: on the requests' pool they would
        # wait behind the storm's own requests (a thousand job lookups) before the first byte.
        self.events = AsyncEventStore(stream_client) if stream_client else store.events
        self.queue_size = queue_size
        self.max_streams = max_streams
        self.max_streams_per_tenant = max_streams_per_tenant
        self.feeds: dict[str, Feed] = {}
        self._lock = asyncio.Lock()
        self.slots = TenantSlots(
            max_streams, max_streams_per_tenant, RETRY_AFTER_SECONDS, self._released
        )
        self._peak = 0  # most streams open at once since the last `_tidy`
        self._reads = asyncio.Semaphore(BACKLOG_READS)
        self.turns = Turns(REPLAY_WRITERS, REPLAY_TURN_SECONDS)
        self._inflight: dict[tuple[str, EventId], asyncio.Task[Page]] = {}
        self._cache: OrderedDict[tuple[str, EventId], tuple[float, Page]] = OrderedDict()
        self._cache_bytes = 0
        self._done: OrderedDict[str, Frame] = OrderedDict()  # ended jobs' `done`, by job

    @classmethod
    def from_settings(
        cls, client: aredis.Redis, store: AsyncJobStore, settings: Settings
    ) -> EventHub:
        """The hub with the event streams' own pool: the feeds' blocking reads and the backlog
        reads, so that neither waits behind the requests nor holds their connections. A feed's
        XREAD BLOCK waits up to BLOCK_MS on the server, so the socket timeout is that plus the
        reply timeout of any other command (the requests' would cut every idle stream). One
        connection per watched job plus BACKLOG_READS: bounded by the stream limit."""
        stream_pool = aredis.ConnectionPool.from_url(
            settings.redis_url,
            decode_responses=True,
            max_connections=settings.sse_max_streams + BACKLOG_READS,
            socket_timeout=BLOCK_MS / 1000 + settings.redis_socket_timeout_seconds,
            socket_connect_timeout=settings.redis_connect_timeout_seconds,
            driver_info=redis_driver_info(),
        )
        return cls(
            client,
            store,
            stream_client=aredis.Redis(connection_pool=stream_pool),
            queue_size=settings.sse_queue_size,
            max_streams=settings.sse_max_streams,
            max_streams_per_tenant=settings.sse_max_streams_per_tenant,
        )

    # -- admission ------------------------------------------------------------------------

    def admit(self, tenant: str) -> Slot:
        """A place for one more stream of `tenant`, or StreamLimitReached."""
        try:
            slot = self.slots.admit(tenant)
        except LimitReached as exc:
            SSE_REFUSED.labels(exc.limit).inc()
            raise
        self._peak = max(self._peak, self.slots.total)
        SSE_SUBSCRIBERS.inc()
        return slot

    def _released(self, open_total: int) -> None:
        SSE_SUBSCRIBERS.dec()
        if open_total <= self._peak // 4 and self._peak >= STORM_STREAMS:
            # A storm is ending: give its memory back soon rather than whenever (`_tidy`), once
            # its last streams are gone too.
            self._peak = open_total
            asyncio.get_running_loop().call_later(TIDY_DELAY_SECONDS, _tidy)

    # -- backlog --------------------------------------------------------------------------

    async def backlog(
        self, job_id: str, after: EventId, until: EventId = (0, 0), *, fresh: bool = False
    ) -> AsyncIterator[Page]:
        """Pages of the entries after `after`, stopping at `done`, and not before the stream's
        end as it was when it reached `until` (the caller's feed takes over from there). Pages
        come from reads other subscribers share; `fresh`: only from reads issued now."""
        while True:
            # In a turn, as the writes are: a thousand subscribers waiting on one shared read
            # would all wake in the same pass of the event loop when it completes.
            async with self.turns.turn():
                page = await self._page(job_id, after, fresh)
            yield page
            last = page.last or after
            # A shared read may have been issued before `until` was written: read on from it.
            if page.done or (not page.full and last >= until):
                return
            after = last

    async def _page(self, job_id: str, after: EventId, fresh: bool) -> Page:
        key = (job_id, after)
        if not fresh:
            cached = self._cache.get(key)
            if cached is not None and time.monotonic() - cached[0] < BACKLOG_CACHE_SECONDS:
                self._cache.move_to_end(key)
                SSE_BACKLOG_PAGES.labels("shared").inc()
                return cached[1]
            task = self._inflight.get(key)
            if task is not None:
                SSE_BACKLOG_PAGES.labels("shared").inc()
                return await asyncio.shield(task)
        task = asyncio.create_task(self._read(job_id, after), name=f"sse backlog {job_id}")
        self._inflight[key] = task

        def settle(read: asyncio.Task[Page]) -> None:
            if self._inflight.get(key) is read:
                del self._inflight[key]
            if not read.cancelled() and read.exception() is None and read.result().stable:
                self._keep(key, read.result())

        task.add_done_callback(settle)
        SSE_BACKLOG_PAGES.labels("read").inc()
        return await asyncio.shield(task)  # a subscriber leaving does not cancel the others' read

    async def _read(self, job_id: str, after: EventId) -> Page:
        async with self._reads:
            read = await self.events.encoded_events_after(job_id, after, BACKLOG_PAGE)
        last = parse_event_id(read.last_id) if read.last_id else None
        return Page(read.chunk, last, read.read >= BACKLOG_PAGE and not read.done, read.done)

    def _keep(self, key: tuple[str, EventId], page: Page) -> None:
        now = time.monotonic()
        if key in self._cache:
            self._uncache(key)
        self._cache[key] = (now, page)
        self._cache_bytes += len(page.chunk)
        while self._cache:
            oldest = next(iter(self._cache))
            stamp, _ = self._cache[oldest]
            if self._cache_bytes <= BACKLOG_CACHE_BYTES and now - stamp < BACKLOG_CACHE_SECONDS:
                break
            self._uncache(oldest)

    def _uncache(self, key: tuple[str, EventId]) -> None:
        _, page = self._cache.pop(key)
        self._cache_bytes -= len(page.chunk)

    async def done_frame(self, job_id: str) -> Frame | None:
        """The `done` of an ended job (kept: it never changes), or None."""
        frame = self._done.get(job_id)
        if frame is None:
            entry = await self.events.last_event_of_type(job_id, "done")
            if entry is None:
                return None
            frame = self._done[job_id] = encode(entry)
            if len(self._done) > DONE_FRAMES_KEPT:
                self._done.popitem(last=False)
        return frame

    # -- live -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str) -> AsyncIterator[Subscriber]:
        async with self._lock:
            feed = self.feeds.get(job_id)
            if feed is None or feed.finished:
                feed = Feed(job_id, await self.store.last_event_id(job_id))
                self.feeds[job_id] = feed
                SSE_FEEDS.set(len(self.feeds))
            sub = Subscriber(self.queue_size, parse_event_id(feed.cursor))
            feed.subscribers.add(sub)
            if feed.task is None:
                feed.task = asyncio.create_task(self._run(feed), name=f"sse feed {job_id}")
        try:
            yield sub
        finally:
            feed.subscribers.discard(sub)
            if not feed.subscribers:
                self._retire(feed)

    def _retire(self, feed: Feed) -> None:
        feed.finished = True
        if self.feeds.get(feed.job_id) is feed:
            del self.feeds[feed.job_id]
            SSE_FEEDS.set(len(self.feeds))
        if feed.task is not None and feed.task is not asyncio.current_task():
            cancel_until_done(feed.task)  # its XREAD can lose a cancel (`api.streaming.cancel`)

    async def _run(self, feed: Feed) -> None:
        key = events_key(feed.job_id)
        failures = 0
        try:
            while feed.subscribers and not feed.finished:
                try:
                    reply = await self.stream_redis.xread(
                        {key: feed.cursor}, count=FEED_COUNT, block=BLOCK_MS
                    )
                except aredis.RedisError as exc:
                    # One line per outage, not a traceback per retry: the readiness probe and
                    # the request path report the store's state.
                    failures += 1
                    level = logging.WARNING if failures == 1 else logging.DEBUG
                    log.log(level, "sse feed %s: Redis error (%s); retrying", feed.job_id, exc)
                    await asyncio.sleep(min(0.5 * failures, 5.0))
                    continue
                if failures:
                    log.info("sse feed %s: Redis is back after %d errors", feed.job_id, failures)
                    failures = 0
                # XREAD names a stream only when it has entries past the cursor; a blocked read
                # that times out returns an empty reply.
                for _stream, entries in cast(list[tuple[str, list[Entry]]], reply or []):
                    feed.cursor = entries[-1][0]
                    batch = Batch.of(entries)
                    self._dispatch(feed, batch)
                    if batch.done:
                        feed.finished = True
        except Exception:
            log.exception("sse feed %s failed; closing its streams", feed.job_id)
            for sub in list(feed.subscribers):
                sub.close()
        finally:
            self._retire(feed)

    def _dispatch(self, feed: Feed, batch: Batch) -> None:
        for sub in list(feed.subscribers):
            if not sub.put(batch):
                log.info("sse subscriber of %s too slow; closing its stream", feed.job_id)
                feed.subscribers.discard(sub)
                sub.close()

    async def close(self) -> None:
        for feed in list(self.feeds.values()):
            for sub in list(feed.subscribers):
                sub.close()
            self._retire(feed)
        if self._owns_stream_client:
            await self.stream_redis.aclose()
            await self.stream_redis.connection_pool.aclose()
