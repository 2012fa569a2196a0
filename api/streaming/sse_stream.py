"""One job's event stream for one client: its backlog, then live batches from the job's feed,
with no gap and no duplicate, ending with `done` (see `api/streaming/events.py` for how the hub
reads and shares them)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator

import redis.asyncio as aredis

from api.streaming.events import EventHub
from api.streaming.sse_frames import PING, frames_after, pieces
from pdppo.store import JobRecord
from pdppo.store.jobs.events import EventId

log = logging.getLogger(__name__)


async def job_events(
    hub: EventHub, job: JobRecord, after: EventId | None, ping_seconds: float
) -> AsyncGenerator[bytes, None]:
    """Encoded SSE frames after `after`, in writes of at most WRITE_BYTES, ending with `done`
    (or when the subscriber is cut off: its client resumes from the last id it got). A stream
    idle for `ping_seconds` gets a comment, so that proxies keep it open.

    A Redis error once the stream has started can only end it (the status is sent): it ends
    cleanly, with one line in the log, and the client resumes from its last id."""
    try:
        async for piece in _job_events(hub, job, after, ping_seconds):
            yield piece
    except aredis.RedisError as exc:
        log.warning("event stream of job %s ended by a Redis error: %s", job.id, exc)


async def _job_events(
    hub: EventHub, job: JobRecord, after: EventId | None, ping_seconds: float
) -> AsyncIterator[bytes]:
    origin = after or (0, 0)
    if job.terminal:
        # Its whole history, `done` included, is in the stream already: no feed needed.
        async for piece in _ended(hub, job.id, origin, origin):
            yield piece
        return

    async with hub.subscribe(job.id) as sub:
        # 1. the backlog, up to where the feed took over; 2. if the job ended before the feed
        # started, the rest of its history; 3. live batches, skipping what 1 already sent.
        last = origin
        async for page in hub.backlog(job.id, last, sub.until):
            async for piece in _replay(hub, page.chunk):
                yield piece
            last = page.last or last
            if page.done:
                return
        record = await hub.store.get(job.id)
        if record is None or record.terminal:
            async for piece in _ended(hub, job.id, origin, last):
                yield piece
            return
        # The first ping comes at a random point of the interval: streams opened together
        # (a reconnect storm) would otherwise all be pinged in the same pass of the loop.
        wait = random.uniform(0.5, 1.0) * ping_seconds
        while True:
            try:
                async with asyncio.timeout(wait):
                    batches = await sub.take()
            except TimeoutError:
                yield PING
                wait = ping_seconds
                continue
            if batches is None:
                return
            chunk, last, done = frames_after(batches, last, origin)
            for piece in pieces(chunk):
                yield piece
            if done:
                return


async def _ended(
    hub: EventHub, job_id: str, origin: EventId, last: EventId
) -> AsyncIterator[bytes]:
    """The rest of an ended job's stream after `last`, through its `done`.

    A client whose id is past the `done` saw a history this server does not have: it gets the
    `done` all the same, so that its stream ends with the job (but not a client whose id *is*
    the `done`: it has it)."""
    async for page in hub.backlog(job_id, last):
        async for piece in _replay(hub, page.chunk):
            yield piece
        last = page.last or last
        if page.done:
            return
    done = await hub.done_frame(job_id)
    if done is None:
        return
    if done.id > last:  # the pages were read before the job ended (shared reads): read on
        async for page in hub.backlog(job_id, last, fresh=True):
            async for piece in _replay(hub, page.chunk):
                yield piece
            if page.done:
                return
    elif done.id != origin:
        yield done.data


async def _replay(hub: EventHub, chunk: bytes) -> AsyncIterator[bytes]:
    """A backlog page's writes, each in its turn (see `Turns`)."""
    for piece in pieces(chunk):
        async with hub.turns.turn():
            yield piece
