"""Fencing a stale claim (issue 12): only the holder of a job's lease may write.

The store's scripts refuse a write whose lease token no longer holds the lease (and write nothing
of it); the job process's `LeaseFence` sees the lease lapse on its own and gates checkpoints; the
job's callback stops the trainer with `LeaseLost` (no checkpoint) on either. Real Redis."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from typing import Any, cast

import pytest
import redis

from pdppo.store import JobRecord, JobStore, StoreRetry, events_key, job_key, lease_key, metrics_key
from pdppo.store.jobs.worker_side import FencedOut
from pdppo.store.retry import log_fields
from tests.support.seed import running_job
from workers.job.events import EventPublisher, JobCallback
from workers.job.lease import Lease, LeaseFence, LeaseLost

TOTAL = 40


def wait_published(client: redis.Redis, job_id: str, steps: int) -> None:
    deadline = time.monotonic() + 5
    while int(client.llen(metrics_key(job_id))) < steps:
        assert time.monotonic() < deadline, f"step {steps} was not published"
        time.sleep(0.01)


def kinds(client: redis.Redis, job_id: str) -> list[tuple[str, Any]]:
    entries = cast(list[tuple[str, dict[str, str]]], client.xrange(events_key(job_id)))
    return [(f["type"], json.loads(f["data"]).get("step")) for _, f in entries]


def test_the_store_refuses_every_write_of_a_stale_token_and_writes_nothing(
    client: redis.Redis,
) -> None:
    store = JobStore(client)
    job = running_job(client)
    first = Lease(client, job.id, seconds=30, owner="w1")
    assert first.acquire()
    token = first.token
    assert store.publish_step(job.id, 1, TOTAL, {"loss": 1.0}, lease_token=token)
    assert store.publish_checkpoint(job.id, 1, "step-000001", lease_token=token)
    assert store.publish_eval(job.id, 1, TOTAL, {"eval_reward_mean": 0.5}, lease_token=token)
    assert store.publish_samples(job.id, 1, [{"completion": "a"}], lease_token=token)
    assert store.add_log_once(job.id, log_fields("hello"), lease_token=token)
    before = kinds(client, job.id)

    # The lease lapses (a frozen worker) and another worker takes it.
    client.delete(lease_key(job.id))
    second = Lease(client, job.id, seconds=30, owner="w2")
    assert second.acquire()
    writes = {
        "step": lambda t: store.publish_step(job.id, 2, TOTAL, {"loss": 2.0}, lease_token=t),
        "checkpoint": lambda t: store.publish_checkpoint(job.id, 2, "step-000002", lease_token=t),
        "eval": lambda t: store.publish_eval(job.id, 2, TOTAL, {"e": 1.0}, lease_token=t),
        "samples": lambda t: store.publish_samples(job.id, 2, [{"c": "b"}], lease_token=t),
        "log": lambda t: store.add_log_once(job.id, log_fields("stale"), lease_token=t),
    }
    for what, write in writes.items():
        with pytest.raises(FencedOut):
            write(token)
        assert kinds(client, job.id) == before, what
    record = store.get(job.id)
    assert record is not None and record.step == 1
    assert client.hget(job_key(job.id), "checkpoint_step") == "1"
    assert client.llen(metrics_key(job.id)) == 1

    # Expired, nobody holding it yet: refused as well (before any second claim).
    client.delete(lease_key(job.id))
    with pytest.raises(FencedOut):
        store.publish_step(job.id, 2, TOTAL, {"loss": 2.0}, lease_token=token)

    # The holder's writes go through.
    assert second.acquire()
    assert store.publish_step(job.id, 2, TOTAL, {"loss": 2.0}, lease_token=second.token)
    assert store.add_log_once(job.id, log_fields("resumed"), lease_token=second.token)
    assert kinds(client, job.id)[len(before) :] == [("metrics", 2), ("log", None)]


def test_the_fence_sees_its_lease_taken_or_expired(client: redis.Redis) -> None:
    client.set(lease_key("j1"), "w1:abc", px=2000)
    fence = LeaseFence(client, "j1", "w1:abc", seconds=2)
    assert fence.check()
    assert 1.8 < fence.held_for <= 2.0
    fence.ensure_held()  # well within its lifetime: no wait
    fence.raise_if_lost()

    client.set(lease_key("j1"), "w2:def", px=2000)
    assert not fence.check()
    assert fence.lost.is_set() and fence.reason == "taken over"
    assert not fence.unreachable  # Redis answered: the job is another worker's, not stranded
    with pytest.raises(LeaseLost):
        fence.raise_if_lost()
    with pytest.raises(LeaseLost):
        fence.ensure_held()

    client.set(lease_key("j2"), "w1:abc", px=2000)
    gone = LeaseFence(client, "j2", "w1:abc", seconds=2)
    client.delete(lease_key("j2"))
    assert not gone.check()
    assert gone.reason == "expired or released"


def test_a_lease_key_without_a_lifetime_is_not_held(client: redis.Redis) -> None:
    """The key names this claim but has no expiry (PTTL -1: nothing renews it, nothing will
    expire it): the gate cannot know for how long it holds, so it refuses the checkpoint."""
    client.set(lease_key("j3"), "w1:abc")
    fence = LeaseFence(client, "j3", "w1:abc", seconds=2)
    with pytest.raises(LeaseLost):
        fence.ensure_held()
    assert fence.reason == "expired without a renewal"
    assert fence.unreachable is False  # Redis answered


def test_the_watch_notices_a_lapsed_lease_within_a_renewal_interval(client: redis.Redis) -> None:
    client.set(lease_key("j1"), "w1:abc", px=3000)
    fence = LeaseFence(client, "j1", "w1:abc", seconds=3)  # looks every 0.5 s
    fence.start()
    try:
        time.sleep(0.7)
        assert not fence.lost.is_set()
        client.delete(lease_key("j1"))  # expired: the worker froze
        gone_at = time.monotonic()
        assert fence.lost.wait(1.0)
        assert time.monotonic() - gone_at <= 0.6
    finally:
        fence.stop()


def gate_renewed_late(client: redis.Redis, seconds: float, left_ms: int) -> float:
    """How long the checkpoint gate of a `seconds` lease with `left_ms` left (under its margin)
    waits when the lease is renewed 0.2 s on; checks that it then holds."""
    client.set(lease_key("j1"), "w1:abc", px=left_ms)
    fence = LeaseFence(client, "j1", "w1:abc", seconds=seconds)
    renewer = threading.Timer(0.2, lambda: client.pexpire(lease_key("j1"), int(seconds * 1000)))
    renewer.start()
    started = time.monotonic()
    fence.ensure_held()
    waited = time.monotonic() - started
    assert fence.held_for > fence.margin and not fence.lost.is_set()
    return waited


def test_the_checkpoint_gate_waits_for_a_late_renewal_and_refuses_a_lapsing_lease(
    client: redis.Redis,
) -> None:
    # 0.4 s left of a 2 s lease (margin 1 s): a checkpoint could outlast it.
    assert 0.15 < gate_renewed_late(client, seconds=2, left_ms=400) < 1.0

    # Never renewed again (its worker froze): the gate refuses once the lease lapses.
    client.set(lease_key("j2"), "w1:abc", px=400)
    stale = LeaseFence(client, "j2", "w1:abc", seconds=2)
    started = time.monotonic()
    with pytest.raises(LeaseLost):
        stale.ensure_held()
    assert 0.3 < time.monotonic() - started < 1.0


def test_the_gate_looks_for_a_late_renewal_every_tenth_of_a_second_whatever_the_lease(
    client: redis.Redis,
) -> None:
    """Of the default 30 s lease, 10 s left (under its 15 s margin): the renewal that comes 0.2 s
    later lets the checkpoint start within a tenth of a second, not a twentieth of the lease
    (1.5 s) later."""
    assert 0.15 < gate_renewed_late(client, seconds=30, left_ms=10_000) < 0.6


def test_a_refused_write_stops_the_job_without_a_checkpoint(client: redis.Redis) -> None:
    """The publisher hears the refusal, tells the fence and drops the rest; the callback then
    raises LeaseLost from should_stop (a True would checkpoint) and from the next step's hook."""
    store = JobStore(client)
    job = running_job(client)
    client.set(lease_key(job.id), "w1:abc", px=30_000)
    fence = LeaseFence(client, job.id, "w1:abc", seconds=30)
    publisher = EventPublisher(store, job, StoreRetry(30), fence)
    ours, theirs = multiprocessing.Pipe()
    callback = JobCallback(publisher, multiprocessing.Event(), theirs, fence)
    publisher.start()
    callback.on_step(1, {"step": 1.0, "loss": 1.0})
    assert not callback.should_stop()
    wait_published(client, job.id, 1)
    client.set(lease_key(job.id), "w2:def", px=30_000)  # held in memory: the gate does not ask
    callback.on_step(2, {"step": 2.0, "loss": 2.0})  # refused in Redis
    # The publisher's thread sets `fenced`, then tells the fence: wait for the second.
    assert fence.lost.wait(5)
    assert isinstance(publisher.fenced, FencedOut)
    assert fence.reason == "a write was refused as stale"
    assert fence.unreachable is False
    with pytest.raises(LeaseLost):
        callback.should_stop()
    with pytest.raises(LeaseLost):
        callback.on_step(3, {"step": 3.0, "loss": 3.0})
    publisher.step(4, {"loss": 4.0})  # dropped
    assert publisher.close() is False
    assert [s for k, s in kinds(client, job.id) if k == "metrics"] == [1]
    assert not ours.poll()


def fenced_job(
    client: redis.Redis, seconds: float
) -> tuple[JobRecord, LeaseFence, EventPublisher, JobCallback]:
    """A running job whose `seconds` lease worker w1 holds, and its job process's fence,
    publisher (not started) and trainer callback."""
    job = running_job(client)
    client.set(lease_key(job.id), "w1:abc", px=int(seconds * 1000))
    fence = LeaseFence(client, job.id, "w1:abc", seconds=seconds)
    publisher = EventPublisher(JobStore(client), job, StoreRetry(30), fence)
    callback = JobCallback(publisher, multiprocessing.Event(), multiprocessing.Pipe()[1], fence)
    return job, fence, publisher, callback


def test_a_refused_write_is_blamed_on_another_holder_before_the_fence_hears_of_it(
    client: redis.Redis,
) -> None:
    """The publisher sets `fenced` and only then tells the fence: a step's hook that runs
    between the two raises from `fenced` alone, and must say "taken over", not "unreachable"
    (a worker hands a job back to the queue, stealing it from its new holder, only when Redis
    was to blame)."""
    job, fence, publisher, callback = fenced_job(client, seconds=30)
    publisher.fenced = FencedOut(job.id, "metrics")  # the fence not told yet
    assert not fence.lost.is_set()
    for hook in (callback.should_stop, lambda: callback.on_step(1, {"step": 1.0})):
        with pytest.raises(LeaseLost) as lost:
            hook()
        assert lost.value.unreachable is False
        assert "no longer holds the job's lease" in str(lost.value)


def test_the_fence_alone_stops_the_job_before_a_checkpoint(client: redis.Redis) -> None:
    """The lease lapsed and nothing has been refused yet: the gate in the step's hook (right
    before the trainer writes that step's checkpoint) raises, and nothing of the step is sent."""
    job, _, publisher, callback = fenced_job(client, seconds=2)
    publisher.start()
    callback.on_step(1, {"step": 1.0, "loss": 1.0})
    wait_published(client, job.id, 1)
    client.delete(lease_key(job.id))
    time.sleep(1.1)  # the lease it knew of now has under its 1 s margin left
    with pytest.raises(LeaseLost):
        callback.on_step(2, {"step": 2.0, "loss": 2.0})
    with pytest.raises(LeaseLost):
        callback.should_stop()
    assert publisher.close()
    assert [s for k, s in kinds(client, job.id) if k == "metrics"] == [1]
