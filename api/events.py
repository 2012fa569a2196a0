"""Server-sent events for a job: the Redis stream's backlog, then live events from one feed.

A blocking XREAD per subscriber would tie up one Redis connection per open stream; instead each
job with subscribers has one feed (an asyncio task doing XREAD BLOCK) that fans entries out to
the subscribers' queues. A subscriber joins the feed first and reads the backlog after, so any
entry is in one or the other (duplicates are dropped by id): no gap, no duplicate. A subscriber
too slow to keep up is cut off; its client reconnects with Last-Event-ID and reads the backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

import redis.asyncio as aredis
from sse_starlette import ServerSentEvent

from api.observability import SSE_FEEDS, SSE_SUBSCRIBERS
from pdppo.store import AsyncJobStore, events_key

log = logging.getLogger(__name__)
Entry = tuple[str, dict[str, str]]
# What subscribers receive: (stream id, event type, the SSE frame encoded once for all of them).
Frame = tuple[str, str, bytes]
BLOCK_MS = 5000
BACKLOG_PAGE = 1000


def parse_id(entry_id: str) -> tuple[int, int]:
    """Stream ids compare as (milliseconds, sequence); '5' means '5-0'."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False)
class Subscriber:
    queue: asyncio.Queue[Frame | None]


@dataclass(eq=False)
class Feed:
    job_id: str
    cursor: str
    subscribers: set[Subscriber] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    finished: bool = False


class EventHub:
    def __init__(self, client: aredis.Redis, store: AsyncJobStore, queue_size: int) -> None:
        self.redis = client
        self.store = store
        self.queue_size = queue_size
        self.feeds: dict[str, Feed] = {}
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str) -> AsyncIterator[Subscriber]:
        async with self._lock:
            feed = self.feeds.get(job_id)
            if feed is None or feed.finished:
                feed = Feed(job_id, await self.store.last_event_id(job_id))
                self.feeds[job_id] = feed
                SSE_FEEDS.set(len(self.feeds))
            sub = Subscriber(asyncio.Queue(self.queue_size))
            feed.subscribers.add(sub)
            if feed.task is None:
                feed.task = asyncio.create_task(self._run(feed), name=f"sse feed {job_id}")
        SSE_SUBSCRIBERS.inc()
        try:
            yield sub
        finally:
            SSE_SUBSCRIBERS.dec()
            feed.subscribers.discard(sub)
            if not feed.subscribers:
                self._retire(feed)

    def _retire(self, feed: Feed) -> None:
        feed.finished = True
        if self.feeds.get(feed.job_id) is feed:
            del self.feeds[feed.job_id]
            SSE_FEEDS.set(len(self.feeds))
        if feed.task is not None and feed.task is not asyncio.current_task():
            feed.task.cancel()

    async def _run(self, feed: Feed) -> None:
        key = events_key(feed.job_id)
        try:
            while feed.subscribers and not feed.finished:
                try:
                    reply = await self.redis.xread({key: feed.cursor}, count=500, block=BLOCK_MS)
                except aredis.RedisError:
                    log.warning("sse feed %s: Redis error; retrying", feed.job_id, exc_info=True)
                    await asyncio.sleep(0.5)
                    continue
                for _stream, entries in cast(list[tuple[str, list[Entry]]], reply or []):
                    for entry in entries:
                        feed.cursor = entry[0]
                        self._dispatch(feed, encode(entry))
                        if entry[1].get("type") == "done":
                            feed.finished = True
        except Exception:
            log.exception("sse feed %s failed; closing its streams", feed.job_id)
            for sub in list(feed.subscribers):
                self._close(sub)
        finally:
            self._retire(feed)

    def _dispatch(self, feed: Feed, frame: Frame) -> None:
        for sub in list(feed.subscribers):
            try:
                sub.queue.put_nowait(frame)
            except asyncio.QueueFull:
                log.info("sse subscriber of %s too slow; closing its stream", feed.job_id)
                feed.subscribers.discard(sub)
                self._close(sub)

    @staticmethod
    def _close(sub: Subscriber) -> None:
        """Ends the subscriber's stream; its client resumes from the last id it received."""
        while not sub.queue.empty():
            sub.queue.get_nowait()
        sub.queue.put_nowait(None)

    async def close(self) -> None:
        for feed in list(self.feeds.values()):
            self._retire(feed)


async def job_events(
    hub: EventHub, store: AsyncJobStore, job_id: str, last_event_id: str | None
) -> AsyncIterator[bytes]:
    """Encoded SSE frames after `last_event_id`, ending with `done` (or when cut off)."""
    last = last_event_id or "0-0"
    async with hub.subscribe(job_id) as sub:
        # 1. backlog; 2. if the job already ended, whatever of the backlog came in meanwhile;
        # 3. live frames from the feed, skipping what the backlog already sent.
        async for entry in _backlog(store, job_id, last):
            last = entry[0]
            yield encode(entry)[2]
            if entry[1].get("type") == "done":
                return
        record = await store.get(job_id)
        if record is None or record.terminal:
            async for entry in _backlog(store, job_id, last):
                yield encode(entry)[2]
                if entry[1].get("type") == "done":
                    return
            return
        while True:
            frame = await sub.queue.get()
            if frame is None:
                return
            if parse_id(frame[0]) <= parse_id(last):
                continue
            last = frame[0]
            yield frame[2]
            if frame[1] == "done":
                return


async def _backlog(store: AsyncJobStore, job_id: str, after: str) -> AsyncIterator[Entry]:
    while True:
        page = await store.events_after(job_id, after, count=BACKLOG_PAGE)
        for entry in page:
            yield entry
        if len(page) < BACKLOG_PAGE:
            return
        after = page[-1][0]


def encode(entry: Entry) -> Frame:
    entry_id, fields = entry
    event = fields.get("type", "log")
    data = fields.get("data", json.dumps({}))
    return entry_id, event, ServerSentEvent(data=data, event=event, id=entry_id).encode()
