"""A Redis stall longer than a job's lease, then the reaper and the job's live holder both act on
the job: whichever comes first, it runs once, its worker is not counted as lost, and the job's log
gives the holder's reason (`pdppo.store.jobs.clock`).

The race is made deterministic with a real redis-server frozen by SIGSTOP: the reaper's pass is
sent while it is frozen (as a reaper thread's calls were, under xdist load, in
`tests/integration/test_redis_stall.py`), so Redis runs it first when it wakes; the holder is a
real `Lease` renewing from its heartbeat thread, and hands the job back with the worker's own
`_hand_back`. Before the store kept its clock, the reaper requeued the job as a lost worker
(`worker_losses` 1, "worker lost" in its log) and the hand-back found it no longer running. A
holder that really died is still counted, once the stall's hold has passed."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from pdppo.store import JobStore, StoreRetry, job_key
from tests.support.seed import running_job, stream
from tests.support.stack import RedisServer
from workers.job import runner
from workers.job.lease import Lease
from workers.upkeep.reaper import reap_once

LEASE = 2.0
FREEZE = 3.5  # past the lease: it expires in Redis's time while nobody can renew it
WHY = (
    "lease expired while Redis was unreachable (x); queued again to resume from its last checkpoint"
)
REAP = functools.partial(reap_once, max_worker_losses=1, lease_seconds=LEASE)


@pytest.fixture
def patient(server: RedisServer) -> Iterator[redis.Redis]:
    """A client that waits a freeze out (the holder's and the reaper's)."""
    conn = redis.Redis.from_url(server.url(), socket_timeout=30, decode_responses=True)
    yield conn
    conn.close()


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tasks the holder's hand-back sends (Celery's `send_task` stood in for)."""
    sent: list[str] = []
    monkeypatch.setattr(runner, "enqueue", lambda job_id, queue, priority=0: sent.append(job_id))
    return sent


def holding(client: redis.Redis) -> Lease:
    """Job j1, claimed by w1, whose lease w1 renews; once the store's clock has been stamped."""
    running_job(client, "j1")
    lease = Lease(client, "j1", LEASE, owner="w1")
    assert lease.acquire()
    lease.start_heartbeat()
    time.sleep(LEASE / 3)  # two renewals
    return lease


def frozen_pass(server: RedisServer, store: JobStore) -> list[str]:
    """A reaper's pass sent while Redis is frozen past the lease; what it sent again."""
    reaped: list[list[str]] = []
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        reaper = threading.Thread(target=lambda: reaped.append(REAP(store)))
        reaper.start()
        time.sleep(FREEZE)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    reaper.join(30)
    assert reaped, "the reaper's pass never ended"
    return reaped[0]


def hand_back(store: JobStore, lease: Lease) -> str | None:
    """The holder, which lost its lease to the stall, hands the job back (the worker's path)."""
    assert lease.lost.wait(10), "the holder never heard that its lease expired"
    assert lease.unreachable
    job = store.get("j1")
    assert job is not None
    return runner._hand_back(store, StoreRetry(10), job, lease, WHY)


def logs(client: redis.Redis) -> list[str]:
    return [data["message"] for kind, data in stream(client, "j1") if kind == "log"]


def test_a_reaper_first_after_a_stall_leaves_the_job_to_its_holder(
    server: RedisServer,
    patient: redis.Redis,
    sent: list[tuple[str, str]],
    handed: list[str],
) -> None:
    store = JobStore(patient)
    lease = holding(patient)
    try:
        assert frozen_pass(server, store) == []  # held: it was ['j1'], a lost worker
        assert patient.hget(job_key("j1"), "status") == "running"
        assert hand_back(store, lease) == "requeued"  # it was 'not-running'
    finally:
        lease.stop_heartbeat()
    assert patient.hmget(job_key("j1"), ["status", "requeues", "worker_losses"]) == [
        "queued",
        "1",
        None,
    ]
    assert logs(patient) == [WHY]
    assert (sent, handed) == ([], ["j1"])  # the task sent once, by the holder


def test_a_holder_first_after_a_stall_leaves_nothing_to_the_reaper(
    server: RedisServer,
    patient: redis.Redis,
    sent: list[tuple[str, str]],
    handed: list[str],
) -> None:
    store = JobStore(patient)
    lease = holding(patient)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(FREEZE)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    try:
        assert hand_back(store, lease) == "requeued"
    finally:
        lease.stop_heartbeat()
    assert REAP(store) == []
    assert patient.hmget(job_key("j1"), ["status", "requeues", "worker_losses"]) == [
        "queued",
        "1",
        None,
    ]
    assert logs(patient) == [WHY]
    assert (sent, handed) == ([], ["j1"])


def test_a_holder_that_died_before_the_stall_is_counted_once_the_hold_has_passed(
    server: RedisServer, patient: redis.Redis, sent: list[tuple[str, str]]
) -> None:
    """The hold is a wait, not a pardon: nobody hands the job back, so the reaper does, as a
    lost worker, about a lease and 3 s after Redis woke."""
    store = JobStore(patient)
    lease = holding(patient)
    lease.stop_heartbeat()  # the worker dies: its lease is never renewed again
    assert frozen_pass(server, store) == []
    woke = time.monotonic()
    while not (reaped := REAP(store)):
        assert time.monotonic() - woke < 3 * LEASE + 5, "never reaped"
        time.sleep(0.1)
    waited = time.monotonic() - woke
    assert reaped == ["j1"]
    assert LEASE + 3 - 0.5 <= waited <= LEASE + 3 + 1.0, waited
    assert patient.hmget(job_key("j1"), ["status", "worker_losses"]) == ["queued", "1"]
    assert logs(patient) == ["worker lost; queued again to resume from its last checkpoint"]
    assert sent == [("j1", "cpu")]
