"""The service's counters in Redis (`pdppo.store.stats`): a job's end is counted once, by the
script that ends it, whichever that is; pending increments survive a failed flush; worker beats.

The end counter as a table of states x requests: each row seeds a job in a state, runs one
request through the real script, and compares the whole `STATS` hash with what it must hold.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis

from pdppo.store import JobRecord, JobStore, job_key, now_iso, tenant_active_key
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.stats import STATS, WORKERS, Tally, beat, read_counters
from tests.support.stack import RedisServer
from workers.upkeep.heartbeat import Heartbeat


@pytest.fixture
def conn(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url(), decode_responses=True)
    yield client
    client.close()


def seed(
    client: redis.Redis,
    state: str,
    *,
    job_id: str = "j1",
    tenant: str = "alice",
    queue: str = "cpu",
) -> JobRecord:
    """A job in `state`: queued, paused, running, running+cancel, running+pause, running+lost
    (lost a worker once already) or succeeded."""
    now = now_iso()
    status = state.split("+")[0]
    fields = {
        "id": job_id,
        "tenant": tenant,
        "status": "queued" if status == "running" else status,
        "queue": queue,
        "spec": "{}",
        "created_at": now,
        "total_steps": "10",
    }
    client.hset(job_key(job_id), mapping=fields)
    client.sadd(tenant_active_key(tenant), job_id)
    store = JobStore(client)
    if status == "running":
        assert store.claim(job_id, "w1")
    extra = {"cancel": "cancel_requested", "pause": "pause_requested", "lost": "worker_losses"}
    if "+" in state:
        client.hset(job_key(job_id), extra[state.split("+")[1]], "1")
    record = store.get(job_id)
    assert record is not None
    return record


def api_call(server: RedisServer, work: Callable[[AsyncJobStore], object]) -> object:
    async def main() -> object:
        client = aredis.Redis.from_url(server.url(), decode_responses=True)
        try:
            return await work(AsyncJobStore(client))  # type: ignore[misc]
        finally:
            await client.aclose()

    return asyncio.run(main())


# (state, request, what the request answers, the counters after it)
ROWS = [
    ("running", "finish:succeeded", True, {"ended|cpu|succeeded|": 1}),
    ("running", "finish:failed:storage_full", True, {"ended|cpu|failed|storage_full": 1}),
    ("running+cancel", "finish:cancelled", True, {"ended|cpu|cancelled|": 1}),
    ("succeeded", "finish:failed:training_error", False, {}),
    ("queued", "api-fail:over_budget", True, {"ended|cpu|failed|over_budget": 1}),
    ("running", "api-fail:over_budget", True, {"ended|cpu|failed|over_budget": 1}),
    ("succeeded", "api-fail:over_budget", False, {}),
    ("queued", "cancel", "cancelled-while-queued", {"ended|cpu|cancelled|": 1}),
    ("paused", "cancel", "cancelled-while-paused", {"ended|cpu|cancelled|": 1}),
    ("running", "cancel", "requested", {}),
    ("succeeded", "cancel", "already-succeeded", {}),
    ("running", "requeue", "requeued", {}),
    ("running+pause", "requeue", "paused", {}),
    ("running+cancel", "requeue", "cancelled", {"ended|cpu|cancelled|": 1}),
    ("running+lost", "requeue", "failed", {"ended|cpu|failed|worker_lost": 1}),
    ("queued", "requeue", "not-running", {}),
]


@pytest.mark.parametrize(("state", "request_", "answer", "counters"), ROWS)
def test_a_job_end_is_counted_by_the_script_that_ends_it(
    server: RedisServer,
    conn: redis.Redis,
    state: str,
    request_: str,
    answer: object,
    counters: dict[str, int],
) -> None:
    job = seed(conn, state)
    store = JobStore(conn)
    kind, *rest = request_.split(":")
    got: object
    if kind == "finish":
        extra = {"error_code": rest[1], "error_message": "x"} if rest[0] == "failed" else None
        got = store.finish(job, rest[0], extra)
    elif kind == "api-fail":
        got = api_call(server, lambda s: s.fail(job, rest[0], "refused"))
    elif kind == "cancel":
        got = api_call(server, lambda s: s.cancel(job.id))
    else:
        got = store.requeue_if_orphaned(job, max_worker_losses=1)
    assert got == answer
    assert read_counters(conn) == counters


def test_two_tenants_ending_jobs_on_one_queue_add_up_and_a_second_end_counts_nothing(
    conn: redis.Redis,
) -> None:
    store = JobStore(conn)
    alice = seed(conn, "running", job_id="a1", tenant="alice", queue="gpu.x2")
    bob = seed(conn, "running", job_id="a1b", tenant="bob", queue="gpu.x2")
    assert store.finish(alice, "succeeded")
    assert store.finish(bob, "succeeded")
    assert not store.finish(alice, "succeeded")
    assert read_counters(conn) == {"ended|gpu.x2|succeeded|": 2}


def test_a_failed_flush_keeps_its_increments_for_the_next(
    server: RedisServer, conn: redis.Redis
) -> None:
    tally = Tally()
    tally.add("lease_renewals", n=3)
    tally.add("lease_losses", "taken")
    down = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens on port 1
    with pytest.raises(redis.ConnectionError):
        tally.flush(down)
    assert tally.pending() == {"lease_renewals": 3, "lease_losses|taken": 1}
    tally.add("lease_renewals")
    tally.flush(conn)
    tally.flush(conn)  # nothing pending: writes nothing
    assert tally.pending() == {}
    assert read_counters(conn) == {"lease_renewals": 4, "lease_losses|taken": 1}


def test_a_beat_stamps_the_worker_and_forgets_workers_silent_for_an_hour(
    conn: redis.Redis,
) -> None:
    conn.zadd(WORKERS, {"gone:1": 1000.0, "late:2": 5000.0})
    beat(conn, "w:3", now=1000.0 + 3601)
    assert conn.zrange(WORKERS, 0, -1, withscores=True) == [("w:3", 4601.0), ("late:2", 5000.0)]


def test_the_heartbeat_writes_its_file_even_when_redis_is_down(tmp_path: Path) -> None:
    down = redis.Redis(port=1, socket_connect_timeout=0.2)
    heartbeat = Heartbeat(tmp_path, "node:1", client=down)
    heartbeat.beat()  # logs, does not raise: the reaper's loop must go on
    assert json.loads((tmp_path / "node_1").read_text())["pid"] > 0


def test_the_heartbeat_stamps_the_worker_in_redis(tmp_path: Path, conn: redis.Redis) -> None:
    Heartbeat(tmp_path, "node:1", client=conn).beat()
    assert conn.zrange(WORKERS, 0, -1) == ["node:1"]
    assert conn.hgetall(STATS) == {}
