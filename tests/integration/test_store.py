"""The Redis job store and the lease, against a real Redis server (no API, no worker)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from pdppo.store import JobRecord, JobStore, events_key, job_key, metrics_key, now_iso
from tests.integration.stack import RedisServer
from workers.lease import Lease, LeaseLost

DB = 15  # services use 0 and the low numbers


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_server.url(DB), decode_responses=True)
    conn.flushdb()
    yield conn
    conn.flushdb()
    conn.close()


def running_job(client: redis.Redis, job_id: str = "j1") -> JobRecord:
    now = now_iso()
    fields = {
        "id": job_id,
        "tenant": "t",
        "status": "queued",
        "queue": "cpu",
        "spec": "{}",
        "created_at": now,
        "total_steps": "10",
    }
    client.hset(job_key(job_id), mapping=fields)
    store = JobStore(client)
    assert store.claim(job_id, "w1")
    record = store.get(job_id)
    assert record is not None and record.status == "running"
    return record


def test_a_step_is_published_once_even_when_a_resumed_run_repeats_it(client: redis.Redis) -> None:
    store = JobStore(client)
    job = running_job(client)
    published = [store.publish_step(job.id, step, 10, {"loss": float(step)}) for step in (1, 2, 3)]
    # A worker died after step 3; its successor resumed from the checkpoint at step 2.
    published += [store.publish_step(job.id, step, 10, {"loss": -1.0}) for step in (3, 4)]
    assert published == [True, True, True, False, True]
    assert client.llen(metrics_key(job.id)) == 4
    events = client.xrange(events_key(job.id))
    steps = [e[1]["data"] for e in events if e[1]["type"] == "metrics"]
    assert len(steps) == 4
    record = store.get(job.id)
    assert record is not None and record.step == 4 and record.metrics == {"loss": -1.0}


def test_finished_job_takes_no_more_changes(client: redis.Redis) -> None:
    store = JobStore(client)
    job = running_job(client)
    assert store.finish(job, "succeeded")
    assert not store.finish(job, "failed")
    assert not store.claim(job.id, "w2")
    assert not store.publish_step(job.id, 5, 10, {"loss": 0.0})
    types = [e[1]["type"] for e in client.xrange(events_key(job.id))]
    assert types == ["status", "status", "done"]


def test_lease_is_exclusive_renewable_and_expires(client: redis.Redis) -> None:
    first = Lease(client, "j1", seconds=1, owner="w1")
    second = Lease(client, "j1", seconds=1, owner="w2")
    assert first.acquire()
    assert not second.acquire()
    assert not second.renew()  # renewing someone else's lease does nothing
    assert first.renew()
    time.sleep(1.2)  # the holder died: nobody renewed
    assert second.acquire()
    assert not first.renew()
    second.release()
    assert client.exists("pdppo:job:j1:lease") == 0


def test_heartbeat_notices_a_lost_lease(client: redis.Redis) -> None:
    lease = Lease(client, "j2", seconds=1, owner="w1")
    assert lease.acquire()
    lease.start_heartbeat()
    time.sleep(0.5)
    lease.check()  # still ours after a renewal
    client.set("pdppo:job:j2:lease", "someone-else")
    deadline = time.monotonic() + 3
    while not lease.lost.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(LeaseLost):
        lease.check()
    lease.release()
    assert client.get("pdppo:job:j2:lease") == "someone-else"  # not ours to delete


def test_orphaned_job_is_requeued_once(client: redis.Redis) -> None:
    store = JobStore(client)
    job = running_job(client)
    lease = Lease(client, job.id, seconds=5, owner="w1")
    assert lease.acquire()
    assert store.requeue_if_orphaned(job) == "leased"
    assert store.requeue_if_orphaned(job, lease_token="not-the-holder") == "leased"
    assert store.requeue_if_orphaned(job, "handed back", lease_token=lease.token) == "requeued"
    assert client.exists("pdppo:job:j1:lease") == 0
    assert store.claim(job.id, "w2")  # running again, and nobody holds its lease: orphaned
    assert store.requeue_if_orphaned(job) == "requeued"
    assert store.requeue_if_orphaned(job) == "not-running"
    record = store.get(job.id)
    assert record is not None and record.status == "queued"


def test_lease_unrenewed_for_its_lifetime_counts_as_lost(client: redis.Redis) -> None:
    lease = Lease(client, "j3", seconds=1, owner="w1")
    assert lease.acquire()  # no heartbeat: as if Redis were unreachable since
    lease.check()
    time.sleep(1.05)
    with pytest.raises(LeaseLost):
        lease.check()


def test_a_job_that_keeps_killing_its_worker_fails(client: redis.Redis) -> None:
    store = JobStore(client)
    job = running_job(client)
    outcomes = []
    for _ in range(3):
        outcomes.append(store.requeue_if_orphaned(job, max_worker_losses=2))
        store.claim(job.id, "next worker")
    assert outcomes == ["requeued", "requeued", "failed"]
    record = store.get(job.id)
    assert record is not None and record.status == "failed"
    assert record.error_code == "worker_lost"
    assert record.error_message is not None and "died 3 times" in record.error_message
    # Handing a job back on shutdown is no loss.
    other = running_job(client, "j9")
    for _ in range(4):
        assert store.requeue_if_orphaned(other, lease_token="t", max_worker_losses=1) == "requeued"
        store.claim(other.id, "next worker")
