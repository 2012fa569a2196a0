"""In-memory stand-ins for the event hub's store and stream reads, for the unit tests of the hub
(test_sse_hub.py, test_sse_backlog.py): a list of stream entries, read as the store's scripts
would encode them. The integration tests use a real Redis."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, cast

from api.streaming.events import EventHub
from api.streaming.sse_frames import Batch
from pdppo.settings import Settings
from pdppo.store import AsyncJobStore
from pdppo.store.jobs.events import EncodedPage, parse_event_id

Entry = tuple[str, dict[str, str]]


def entries(first: int, count: int, done_at: int | None = None) -> list[Entry]:
    out: list[Entry] = []
    for n in range(first, first + count):
        kind = "done" if n == done_at else "metrics"
        out.append((f"{n}-0", {"type": kind, "data": json.dumps({"step": n})}))
    return out


def page_of(later: list[Entry]) -> EncodedPage:
    """`later` (the entries a read found) as the store's script encodes them."""
    batch = Batch.of(later)
    last = batch.frames[-1].id if batch.frames else None
    return EncodedPage(
        batch.chunk, f"{last[0]}-{last[1]}" if last else None, len(later), batch.done
    )


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
        return page_of([e for e in self.stream if parse_event_id(e[0]) > after][:count])

    async def last_event_of_type(self, job_id: str, event_type: str) -> Entry | None:
        return next((e for e in reversed(self.stream) if e[1]["type"] == event_type), None)


@dataclass
class FakeJob:
    """What an event stream reads of a job's record."""

    id: str = "job"
    terminal: bool = False


class FakeStore:
    def __init__(self, events: FakeEvents, job: FakeJob | None = None) -> None:
        self.events = events
        self.job = job

    async def last_event_id(self, job_id: str) -> str:
        return self.events.stream[-1][0] if self.events.stream else "0-0"

    async def get(self, job_id: str) -> FakeJob | None:
        return self.job


class IdleRedis:
    """A Redis client for the feed of a job that writes nothing more: each XREAD blocks its
    time out."""

    async def xread(self, streams: dict[str, str], count: int, block: int) -> list[Any]:
        await asyncio.sleep(block / 1000)
        return []


def hub_of(
    events: FakeEvents,
    stream_client: Any = None,
    *,
    client: Any = None,
    job: FakeJob | None = None,
    store: FakeStore | None = None,
    **limits: int,
) -> EventHub:
    """A hub over `store`, by default a store of `events` and of `job` (the record it answers
    for every id), with the settings' default limits unless `limits` says otherwise. Its feeds
    read `client` unless `stream_client` is given (which then serves the backlog reads too, as
    in the API)."""
    settings = Settings()
    return EventHub(
        cast(Any, client),
        cast(AsyncJobStore, store or FakeStore(events, job)),
        stream_client=stream_client,
        queue_size=limits.get("queue_size", settings.sse_queue_size),
        max_streams=limits.get("max_streams", settings.sse_max_streams),
        max_streams_per_tenant=limits.get(
            "max_streams_per_tenant", settings.sse_max_streams_per_tenant
        ),
    )


def hub_over(stream: list[Entry], **limits: int) -> tuple[EventHub, FakeEvents]:
    events = FakeEvents(stream)
    return hub_of(events, **limits), events


def event_ids(chunk: bytes) -> list[str]:
    return [line[4:] for line in chunk.decode().splitlines() if line.startswith("id: ")]


async def drain(stream: Any) -> bytes:
    return b"".join([bytes(piece) async for piece in stream])
