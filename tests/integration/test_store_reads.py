"""What the API reads from the job store, against a real Redis server: job listings filtered by
status, the SSE backlog's encoded pages, a stream's last id and its `done`."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from pdppo.store import JobStore, events_key, job_key, now_iso
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.jobs.events import LAST_POSSIBLE_ID, AsyncEventStore, EncodedPage
from tests.support.stack import Run


@pytest.fixture
def client(store_redis: redis.Redis) -> redis.Redis:
    return store_redis


async def create(store: AsyncJobStore, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        made = await store.create(
            tenant="t", queue="cpu", name=None, spec_json="{}", total_steps=4, max_active=1000,
            idempotency=None, idempotency_ttl=0,
        )  # fmt: skip
        assert made.job_id is not None
        ids.append(made.job_id)
    return ids


def test_a_status_listing_reads_past_a_first_batch_without_a_match(
    client: redis.Redis, run_store: Run
) -> None:
    """60 jobs, the 5 oldest cancelled: the listing's first scan batch (50 ids) holds none of
    them, and it reads on to find all 5, newest first, with no cursor after them."""

    async def work(store: AsyncJobStore) -> tuple[list[str], list[str], str | None]:
        ids = await create(store, 60)
        oldest = sorted(ids)[:5]
        for job_id in oldest:
            assert await store.cancel(job_id) == "cancelled-while-queued"
        page, cursor = await store.list_jobs("t", limit=10, cursor=None, status="cancelled")
        return oldest, [r.id for r in page], cursor

    oldest, listed, cursor = run_store(work)
    assert listed == sorted(oldest, reverse=True)
    assert cursor is None


def test_an_active_listing_holds_only_that_status_and_pages_with_a_cursor(
    client: redis.Redis, run_store: Run
) -> None:
    ids = sorted(run_store(lambda store: create(store, 4)), reverse=True)  # newest first
    assert JobStore(client).claim(ids[1], "w1")  # running; the other 3 stay queued
    queued = [ids[0], ids[2], ids[3]]

    async def work(store: AsyncJobStore) -> list[tuple[list[str], str | None]]:
        pages = []
        for status, cursor in (("queued", None), ("queued", ids[2]), ("running", None)):
            page, after = await store.list_jobs("t", limit=2, cursor=cursor, status=status)
            pages.append(([r.id for r in page], after))
        return pages

    first, second, running = run_store(work)
    assert first == (queued[:2], queued[1])  # the cursor is the page's last id
    assert second == ([queued[2]], None)
    assert running == ([ids[1]], None)


def add(client: redis.Redis, job_id: str, *entries: tuple[str, str]) -> None:
    """Entries with the given ids (small ones: nothing else is at or below them)."""
    for entry_id, kind in entries:
        client.xadd(events_key(job_id), {"type": kind, "data": "{}"}, id=entry_id)


def frame(entry_id: str, kind: str) -> str:
    return f"id: {entry_id}\r\nevent: {kind}\r\ndata: {{}}\r\n\r\n"


def test_an_encoded_page_starts_strictly_after_the_id_asked(
    client: redis.Redis, run_store: Run
) -> None:
    add(client, "j", ("0-1", "log"), ("1-1", "status"), ("2-0", "metrics"), ("3-0", "done"))

    async def work(store: AsyncJobStore) -> list[EncodedPage]:
        events = store.events
        return [
            await events.encoded_events_after("j", after, count)
            for after, count in (((0, 0), 10), ((0, 1), 10), ((1, 0), 2), ((2, 0), 10))
        ] + [await events.encoded_events_after("j", LAST_POSSIBLE_ID, 10)]

    whole, after_first, two, last, none = run_store(work)
    rest = frame("1-1", "status") + frame("2-0", "metrics") + frame("3-0", "done")
    assert whole == EncodedPage((frame("0-1", "log") + rest).encode(), "3-0", 4, True)
    assert after_first == EncodedPage(rest.encode(), "3-0", 3, True)
    assert two == EncodedPage(
        (frame("1-1", "status") + frame("2-0", "metrics")).encode(), "2-0", 2, False
    )
    assert last == EncodedPage(frame("3-0", "done").encode(), "3-0", 1, True)
    assert none == EncodedPage(b"", None, 0, False)


def test_the_last_id_and_the_done_among_the_last_hundred_entries(
    client: redis.Redis, run_store: Run
) -> None:
    """An ended job's `done` is found under up to 99 stray entries after it (100 entries read:
    the done and 99 more), not under 100."""
    add(client, "a", ("1-0", "status"), ("2-0", "done"), *((f"3-{i}", "log") for i in range(99)))
    add(client, "b", ("1-0", "status"), ("2-0", "done"), *((f"3-{i}", "log") for i in range(100)))

    async def work(store: AsyncJobStore) -> list[object]:
        events: AsyncEventStore = store.events
        return [
            await store.last_event_id("a"),
            await store.last_event_id("empty"),
            await events.last_event_of_type("a", "done"),
            await events.last_event_of_type("b", "done"),
            await events.last_event_of_type("a", "status"),
        ]

    last, empty, done_a, done_b, status_a = run_store(work)
    assert (last, empty) == ("3-98", "0-0")
    assert done_a == ("2-0", {"type": "done", "data": "{}"})
    assert done_b is None and status_a is None


def test_the_result_rows_come_oldest_first(client: redis.Redis, run_store: Run) -> None:
    """`/eval` reads every evaluation; `/samples` the newest `limit` rows, oldest of them first."""
    now = now_iso()
    client.hset(
        job_key("r"),
        mapping={"id": "r", "tenant": "t", "status": "queued", "queue": "cpu", "created_at": now},
    )
    worker = JobStore(client)
    assert worker.claim("r", "w1")
    for step in (1, 2, 3):
        assert worker.publish_eval("r", step, 3, {"reward": step / 10})
        assert worker.publish_samples("r", step, [{"prompt": f"p{step}"}])

    async def work(store: AsyncJobStore) -> list[Any]:
        return [
            await store.events.eval_history("r"),
            await store.events.samples_history("r", 2),
        ]

    evals, samples = run_store(work)
    assert evals == [{"step": s, "metrics": {"reward": s / 10}} for s in (1, 2, 3)]
    assert samples == [{"step": s, "samples": [{"prompt": f"p{s}"}]} for s in (2, 3)]
