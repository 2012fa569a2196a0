"""A subscriber that stops reading gets every event or is cut off cleanly, never a silent gap.

The API keeps at most `PDPPO_SSE_QUEUE_SIZE` live events per subscriber (`api.streaming.events`):
one that falls further behind is cut off, its stream ending (without `done`) after the events it was
handed, and its client resumes with `Last-Event-ID`. What must never happen is the quiet
alternative, the frames that did not fit dropped while the stream goes on: a client would miss
steps and never know.

The client here reads through a tiny socket receive buffer and stops reading while thousands of
events (a few MB) are published, far more than the socket buffers and the subscriber's queue
hold; then it reads on.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import redis

from pdppo.store import events_key
from pdppo.store.jobs.events import EventStore
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, Service
from tests.support.waits import read_events, wait_status

QUEUE_SIZE = 16  # the smallest the setting allows
PUBLISHED = 8000
PADDING = "x" * 2000  # ~2 KB an event, 16 MB in all: more than the sockets' buffers hold
RECEIVE_BUFFER = 65536


@dataclass
class Reading:
    """What one stream delivered: its events, and whether it ended (and how)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False  # the server ended the response (a clean end of the chunked body)

    @property
    def ids(self) -> list[str]:
        return [e["id"] for e in self.events]


def parse(lines: Iterator[str], reading: Reading, until: Callable[[], bool]) -> None:
    """Events from SSE `lines` into `reading` until `until()` holds (checked at every line,
    pings included) or the stream ends."""
    fields: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
        elif "event" in fields:
            data = json.loads(fields["data"])
            reading.events.append({"id": fields["id"], "event": fields["event"], "data": data})
            fields = {}
        else:
            fields = {}  # the end of a ping (a comment)
        if until():
            return
    reading.ended = True


def slow_client(svc: Service) -> httpx.Client:
    """Alice's client over a socket whose receive buffer is as small as the kernel allows: a
    client that stops reading stalls the server's writes at once."""
    transport = httpx.HTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)]
    )
    return httpx.Client(
        base_url=svc.base_url,
        headers={"Authorization": f"Bearer {KEYS['alice']}"},
        transport=transport,
        timeout=30,
    )


def test_a_slow_subscriber_is_cut_off_cleanly_and_resumes_without_a_gap(
    make_service: Callable[..., Service],
) -> None:
    """Protects `api.streaming.events.Subscriber.put` / `EventHub._dispatch`: a subscriber too far
    behind is closed (the stream ends after the events it holds), never handed a stream with frames
    missing."""
    svc = make_service(PDPPO_SSE_QUEUE_SIZE=str(QUEUE_SIZE))
    svc.start_api()  # no worker: the job stays queued, its stream live; events come from here
    store = redis.Redis.from_url(svc.redis_url, decode_responses=True)
    with svc.client("alice") as alice, slow_client(svc) as slow:
        job_id = alice.post("/v1/jobs", json=smoke_spec()).json()["id"]
        first = Reading()
        try:
            with slow.stream("GET", f"/v1/jobs/{job_id}/events") as response:
                assert response.status_code == 200, response.read()
                lines = response.iter_lines()
                parse(lines, first, until=lambda: len(first.events) == 1)  # live: in the feed
                assert first.events[0]["data"]["status"] == "queued"

                for start in range(0, PUBLISHED, 500):  # while the client reads nothing
                    pipe = store.pipeline(transaction=False)
                    for n in range(start, start + 500):
                        EventStore(pipe).publish_log(job_id, f"line {n} {PADDING}")
                    pipe.execute()
                time.sleep(1.0)  # the feed hands them over meanwhile

                deadline = time.monotonic() + 30
                parse(lines, first, until=lambda: time.monotonic() > deadline)
            entries = cast(list[tuple[str, Any]], store.xrange(events_key(job_id)))
            stored = [entry_id for entry_id, _ in entries]

            # Whatever it got, it got in order and without a hole...
            assert first.ids == stored[: len(first.ids)], "a gap in the slow stream"
            # ...and here it was too slow: cut off, the stream ended, before the last event.
            assert first.ended, (
                f"the stream neither ended nor delivered every event: {len(first.ids)} of "
                f"{len(stored)}"
            )
            assert len(first.ids) < len(stored)
            assert all(e["event"] != "done" for e in first.events)

            # Its client resumes after the last id it got: the rest, exactly.
            rest = read_events(
                alice, job_id, last_event_id=first.ids[-1], limit=len(stored) - len(first.ids)
            )
            assert first.ids + [e["id"] for e in rest] == stored
            messages = [e["data"]["message"] for e in first.events[1:] + rest]
            assert messages == [f"line {n} {PADDING}" for n in range(PUBLISHED)]
        finally:
            alice.post(f"/v1/jobs/{job_id}/cancel")
        assert wait_status(alice, job_id, "cancelled")["status"] == "cancelled"
        tail = read_events(alice, job_id, last_event_id=stored[-1], timeout=30)
        assert [e["event"] for e in tail] == ["status", "done"]
    store.close()
