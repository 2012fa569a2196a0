"""SSE frames as the event streams send them: each stream entry encoded once (`encode`), read
together in batches shared by every subscriber, cut into writes of WRITE_BYTES, and the turns
that keep a thousand replaying subscribers from writing in one pass of the event loop (`Turns`).
See `api/streaming/events.py` for the hub that reads them and `api/streaming/sse_stream.py` for one
stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

from sse_starlette import ServerSentEvent

from pdppo.store.jobs.events import EventId, parse_event_id

Entry = tuple[str, dict[str, str]]
WRITE_BYTES = 64 * 1024  # one write to a client: uvicorn's high-water mark
PING = b": ping\r\n\r\n"  # a comment: clients ignore it, proxies see traffic


class Turns:
    """At most `width` holders at once, each for at most `lease` seconds.

    Backlog fetches and writes take turns: a write is a burst of CPU (framing, copying 64 KiB)
    that does not yield to the event loop while the client's socket takes it, and a thousand
    replaying subscribers woken together by one shared read would run all their writes in one
    pass of the loop, a health check queued behind them. Taking turns keeps each pass short. A
    turn is a lease: a write that waits on a slow client gives its turn up after `lease` (the
    stream itself goes on), so that slow clients cannot stall the others."""

    def __init__(self, width: int, lease: float) -> None:
        self._free = asyncio.Semaphore(width)
        self.lease = lease

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        await self._free.acquire()
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._free.release()

        expiry = asyncio.get_running_loop().call_later(self.lease, release)
        try:
            yield
        finally:
            expiry.cancel()
            release()


@dataclass(frozen=True, slots=True)
class Frame:
    """One stream entry as an SSE frame, encoded once for every subscriber."""

    id: EventId
    event: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Batch:
    """Frames read together (a backlog page, a feed reply), cut after `done`, joined once."""

    frames: tuple[Frame, ...]
    chunk: bytes

    @classmethod
    def of(cls, entries: Sequence[Entry]) -> Batch:
        frames: list[Frame] = []
        for entry in entries:
            frames.append(encode(entry))
            if frames[-1].event == "done":
                break  # the stream ends there, for every subscriber
        return cls(tuple(frames), b"".join(f.data for f in frames))

    @property
    def last(self) -> EventId | None:
        return self.frames[-1].id if self.frames else None

    @property
    def done(self) -> bool:
        return bool(self.frames) and self.frames[-1].event == "done"


@dataclass(frozen=True, slots=True)
class Page:
    """A backlog read, as the frames to send (encoded by Redis: `encoded_events_after`)."""

    chunk: bytes
    last: EventId | None  # None: nothing after the start
    full: bool  # it stopped at BACKLOG_PAGE entries: more may follow
    done: bool

    @property
    def stable(self) -> bool:
        """Full pages and pages ending with `done` never change: safe to keep and share."""
        return self.full or self.done


def frames_after(
    batches: list[Batch], last: EventId, origin: EventId
) -> tuple[bytes, EventId, bool]:
    """The frames of `batches` after `last`, joined, up to `done`; and the new `last`. A `done`
    at or before `last` still goes out unless it is the client's own id (see
    `api.streaming.sse_stream._ended`): only a client ahead of the stream can meet one."""
    if len(batches) == 1 and batches[0].frames and batches[0].frames[0].id > last:
        batch = batches[0]  # the usual case: share the batch's chunk as it is
        return batch.chunk, batch.last or last, batch.done
    parts: list[bytes] = []
    for batch in batches:
        for frame in batch.frames:
            if frame.id > last:
                parts.append(frame.data)
                last = frame.id
            elif frame.event == "done" and frame.id != origin:
                parts.append(frame.data)
            if frame.event == "done":
                return b"".join(parts), last, True
    return b"".join(parts), last, False


def pieces(chunk: bytes) -> Iterator[bytes]:
    """`chunk` in writes of WRITE_BYTES: the server waits for a slow client between writes, so
    it never holds more than one of them per stream (the chunk itself is shared)."""
    if len(chunk) <= WRITE_BYTES:
        if chunk:
            yield chunk
        return
    view = memoryview(chunk)
    for start in range(0, len(chunk), WRITE_BYTES):
        yield bytes(view[start : start + WRITE_BYTES])  # ASGI bodies are bytes: one copy


def encode(entry: Entry) -> Frame:
    """The entry as `id:`/`event:`/`data:` lines, exactly as `ServerSentEvent.encode` writes
    them, without its per-event overhead for the usual one-line JSON data."""
    entry_id, fields = entry
    event = fields.get("type", "log")
    data = fields.get("data", json.dumps({}))
    if "\n" in data or "\r" in data or "\n" in event or "\r" in event:
        raw = ServerSentEvent(data=data, event=event, id=entry_id).encode()
    else:
        raw = f"id: {entry_id}\r\nevent: {event}\r\ndata: {data}\r\n\r\n".encode()
    return Frame(parse_event_id(entry_id), event, raw)
