"""The Redis job store and the lease, against a real Redis server (no API, no worker)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
import redis.asyncio as aredis

from pdppo.store import (
    OUTBOX,
    JobRecord,
    JobStore,
    Outbox,
    events_key,
    job_key,
    metrics_key,
    now_iso,
    tenant_active_key,
)
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.jobs.events import AsyncEventStore
from pdppo.store.jobs.steering import Steering
from pdppo.store.jobs.worker_side import FencedOut
from pdppo.store.keys import eval_key
from tests.support import seed
from tests.support.stack import STORE_DB, RedisServer, Run
from workers.job.lease import Lease, LeaseLost


@pytest.fixture
def client(store_redis: redis.Redis) -> redis.Redis:
    return store_redis


def running_job(client: redis.Redis, job_id: str = "j1") -> JobRecord:
    """A job of 10 steps claimed by worker w1."""
    return seed.running_job(client, job_id, total_steps=10)


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
    # With no limit (the default) a job is requeued however often its workers die.
    unlimited = running_job(client, "j10")
    for _ in range(3):
        assert store.requeue_if_orphaned(unlimited) == "requeued"
        store.claim(unlimited.id, "next worker")


def _pause_log(client: redis.Redis, job: JobRecord) -> str:
    """The message of the log entry a requeue of a job with a pending pause adds."""
    client.hset(job_key(job.id), "pause_requested", "1")
    assert JobStore(client).requeue_if_orphaned(job) == "paused"
    logs = [e[1]["data"] for e in client.xrange(events_key(job.id)) if e[1]["type"] == "log"]
    return str(json.loads(logs[-1])["message"])


def test_a_job_paused_as_its_worker_leaves_says_the_step_it_resumes_after(
    client: redis.Redis,
) -> None:
    store = JobStore(client)
    fresh = running_job(client, "j11")
    assert _pause_log(client, fresh).startswith("paused at step 0; resume it with POST")
    job = running_job(client, "j12")
    for step in (1, 2, 3):
        store.publish_step(job.id, step, 10, {"loss": 0.0})
    assert _pause_log(client, job).startswith(
        "paused at step 3; resume it with POST /v1/jobs/j12/resume (pdppo resume j12)"
    )


def test_a_created_or_resumed_job_enters_the_outbox_a_grace_from_now(
    client: redis.Redis, run_store: Run
) -> None:
    """The API publishes a new or resumed job's task itself: the dispatcher's first look at the
    job comes `dispatch_grace` later (sooner, it would send a second task for nearly every
    job). A new job keeps the name it was given."""

    async def create_and_resume(
        store: AsyncJobStore,
    ) -> tuple[list[str], list[float], list[float]]:
        made, before, after = [], [], []
        for name in ("my run", None, "paused"):
            before.append(time.time())
            made.append(await store.create(
                tenant="t", queue="cpu", name=name, spec_json="{}", total_steps=4,
                max_active=5, idempotency=None, idempotency_ttl=60, dispatch_grace=7.0,
            ))  # fmt: skip
            after.append(time.time())
        assert [m.outcome for m in made] == ["created"] * 3
        ids = [m.job_id or "" for m in made]
        assert (await store.steering.pause(ids[2])).outcome == "paused"
        before[2] = time.time()
        assert await store.steering.resume(ids[2], dispatch_grace=7.0) == "queued"
        after[2] = time.time()
        return ids, before, after

    ids, before, after = run_store(create_and_resume)
    records = [JobStore(client).get(job_id) for job_id in ids]
    assert [r.name if r else "missing" for r in records] == ["my run", None, "paused"]
    for job_id, low, high in zip(ids, before, after, strict=True):
        score = client.zscore(OUTBOX, job_id)
        assert score is not None and low + 7.0 <= score <= high + 7.0, (job_id, score, low)


def _queued(client: redis.Redis, job_id: str, queue: str = "cpu", tenant: str = "t") -> None:
    """A queued job as `_CREATE` leaves it, less its outbox entry (a job from before the outbox)."""
    client.hset(
        job_key(job_id),
        mapping={
            "id": job_id,
            "tenant": tenant,
            "status": "queued",
            "queue": queue,
            "spec": "{}",
            "created_at": now_iso(),
        },
    )
    client.sadd(tenant_active_key(tenant), job_id)


def test_adoption_counts_the_queued_jobs_it_added_and_only_those(client: redis.Redis) -> None:
    """A worker starting up adds every queued job missing from the outbox (the log line reports
    the count); a running job is not in doubt and is left out."""
    for job_id in ("a", "b", "c"):
        _queued(client, job_id)
    running_job(client, "r")  # claimed: not queued any more
    client.sadd(tenant_active_key("t"), "r")
    outbox = Outbox(client)
    assert outbox.adopt_queued(at=100.0) == 3
    assert outbox.adopt_queued(at=200.0) == 0  # already there, untouched
    assert client.zrange(OUTBOX, 0, -1, withscores=True) == [
        ("a", 100.0),
        ("b", 100.0),
        ("c", 100.0),
    ]


def test_adoption_of_a_tenant_with_more_queued_jobs_than_one_batch_adds_them_all(
    client: redis.Redis,
) -> None:
    """Adoption works through a tenant's active jobs 200 to a script call: 401 take three calls,
    and none is missed at a batch's edge."""
    ids = [f"q{i:03}" for i in range(401)]
    for job_id in ids:
        _queued(client, job_id)
    assert Outbox(client).adopt_queued(at=100.0) == 401
    assert client.zrange(OUTBOX, 0, -1) == ids


def test_check_at_only_brings_an_existing_check_forward(client: redis.Redis) -> None:
    """What a worker does when a task looks lost: an earlier check, never a later one, and no
    entry for a job that has left the outbox (claimed or finished meanwhile)."""
    client.zadd(OUTBOX, {"a": 100.0})
    outbox = Outbox(client)
    outbox.check_at("a", 200.0)
    outbox.check_at("gone", 50.0)
    assert client.zrange(OUTBOX, 0, -1, withscores=True) == [("a", 100.0)]
    outbox.check_at("a", 60.0)
    assert client.zrange(OUTBOX, 0, -1, withscores=True) == [("a", 60.0)]


def test_take_due_returns_the_due_queued_jobs_with_their_queues_and_holds_them(
    client: redis.Redis,
) -> None:
    """What the dispatcher acts on: the entries due by `now` whose job is still queued, each with
    its queue, their next check moved to now + hold; a due entry of a job no longer queued is
    dropped; one not due yet is left as it was."""
    _queued(client, "a", "cpu")
    _queued(client, "b", "gpu")
    _queued(client, "later", "cpu")
    _queued(client, "gone", "cpu")
    client.hset(job_key("gone"), "status", "cancelled")
    client.zadd(OUTBOX, {"a": 10.0, "b": 20.0, "gone": 15.0, "later": 50.0})
    outbox = Outbox(client)
    assert sorted(outbox.take_due(5.0, now=30.0)) == [("a", "cpu"), ("b", "gpu")]
    assert dict(client.zrange(OUTBOX, 0, -1, withscores=True)) == {
        "a": 35.0,
        "b": 35.0,
        "later": 50.0,
    }
    assert outbox.take_due(5.0, now=30.0) == []  # held: a second dispatcher gets nothing
    # without `now`, the clock: everything above is due today
    before = time.time()
    assert sorted(outbox.take_due(60.0)) == [("a", "cpu"), ("b", "gpu"), ("later", "cpu")]
    scores = dict(client.zrange(OUTBOX, 0, -1, withscores=True))
    assert all(before + 60.0 <= s <= time.time() + 60.0 for s in scores.values()), scores


def test_a_requeued_job_is_checked_a_grace_after_the_requeue(client: redis.Redis) -> None:
    """The reaper that requeues a job sends its task itself; the dispatcher's first look comes
    `dispatch_grace` later, so it finds the task and sends no duplicate."""
    store = JobStore(client)
    job = running_job(client)
    before = time.time()
    assert store.requeue_if_orphaned(job, dispatch_grace=7.0) == "requeued"
    score = client.zscore(OUTBOX, job.id)
    assert score is not None and before + 7.0 <= score <= time.time() + 7.0


def test_every_evaluation_is_kept_in_step_order(client: redis.Redis) -> None:
    """`/eval` serves the whole evaluation history (a curve), unlike a capped list."""
    store = JobStore(client)
    job = running_job(client)
    for step in (2, 4, 6):
        assert store.publish_eval(job.id, step, 10, {"reward": step / 10})
    assert not store.publish_eval(job.id, 4, 10, {"reward": 0.0})  # a resumed run repeats it
    rows = [json.loads(r) for r in client.lrange(eval_key(job.id), 0, -1)]
    assert rows == [{"step": s, "metrics": {"reward": s / 10}} for s in (2, 4, 6)]


def test_the_newest_event_of_a_type_is_found_among_the_last_ones(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    """How the API finds an ended job's `done` (its last event but for a stray log line)."""
    types = ["status", "metrics", "done", "log", "log"]
    ids = [client.xadd(events_key("e1"), {"type": t, "data": str(i)}) for i, t in enumerate(types)]

    async def read(event_type: str, within: int = 100) -> object:
        conn = aredis.Redis.from_url(redis_server.url(STORE_DB), decode_responses=True)
        try:
            return await AsyncEventStore(conn).last_event_of_type("e1", event_type, within)
        finally:
            await conn.aclose()

    assert asyncio.run(read("done")) == (ids[2], {"type": "done", "data": "2"})
    assert asyncio.run(read("log")) == (ids[4], {"type": "log", "data": "4"})
    assert asyncio.run(read("status", within=2)) is None  # older than the last two
    assert asyncio.run(read("eval")) is None


def test_a_config_change_is_announced_once_per_version_and_only_by_the_lease_holder(
    client: redis.Redis,
) -> None:
    """A resumed run that restarts before a change's step applies it again: its `config` event
    must not appear twice; and a stale claim's announcement is refused like its other writes."""
    job = running_job(client)
    steering = Steering(client)
    lease = Lease(client, job.id, 30, "w1")
    assert lease.acquire()
    said = [
        steering.announce(job.id, 4, 1, {"optim.lr": 1e-4}, lease_token=lease.token),
        steering.announce(job.id, 2, 1, {"optim.lr": 1e-4}, lease_token=lease.token),  # again
        steering.announce(job.id, 6, 2, {"steps": 9}, lease_token=lease.token),
    ]
    assert said == [True, False, True]
    events = client.xrange(events_key(job.id))
    configs = [json.loads(e[1]["data"]) for e in events if e[1]["type"] == "config"]
    assert configs == [
        {"step": 4, "version": 1, "changes": {"optim.lr": 1e-4}},
        {"step": 6, "version": 2, "changes": {"steps": 9}},
    ]
    with pytest.raises(FencedOut):
        steering.announce(job.id, 7, 3, {"steps": 10}, lease_token="stale-token")


def test_take_due_takes_at_most_its_limit_a_pass_and_the_rest_next_time(
    client: redis.Redis,
) -> None:
    """A reaper's pass over a long outbox is bounded (200 entries): the rest waits a pass."""
    for i in range(201):
        _queued(client, f"j{i:03}")
    client.zadd(OUTBOX, {f"j{i:03}": float(i) for i in range(201)})
    outbox = Outbox(client)
    first = outbox.take_due(1000.0, now=500.0)
    assert [job_id for job_id, _ in first] == [f"j{i:03}" for i in range(200)]
    assert outbox.take_due(1000.0, now=500.0) == [("j200", "cpu")]
