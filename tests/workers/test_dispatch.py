"""The outbox dispatcher (`workers.upkeep.reaper`) against a real Redis: a task a worker took
moments ago is left to that worker, and the dispatcher runs on its own short tick however long the
reaper's interval is. The end-to-end paths (a task never sent, a taker that died) are
tests/integration/test_outbox.py's."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from kombu.transport.redis import Channel as RedisChannel

from pdppo.settings import Settings
from pdppo.store import OUTBOX, JobStore, job_key, now_iso, tenant_active_key
from tests.support.stack import RedisServer, stall
from workers.celery_app import celery_app
from workers.upkeep.reaper import CONFIRM_SECONDS, DispatchTiming, dispatch_once, start_reaper


def _queued(client: redis.Redis, job_id: str, status: str = "queued") -> None:
    client.hset(
        job_key(job_id),
        mapping={
            "id": job_id,
            "tenant": "t",
            "status": status,
            "queue": "cpu",
            "spec": "{}",
            "created_at": now_iso(),
        },
    )


def _taken(client: redis.Redis, job_id: str, tag: str, at: float) -> None:
    """kombu's record of a message a consumer took at `at` and has not acknowledged: the message
    (Celery's protocol 2 carries the task id, our job id, in its headers) in `unacked`, the take
    time in `unacked_index`."""
    message = {"body": "", "headers": {"id": job_id, "task": "pdppo.train"}, "properties": {}}
    client.hset(RedisChannel.unacked_key, tag, json.dumps([message, "", "cpu"]))
    client.zadd(RedisChannel.unacked_index_key, {tag: at})


def assert_due_in(client: redis.Redis, job_id: str, seconds: float, since: float) -> None:
    """The job's outbox entry is due `seconds` after a dispatch that began at `since`."""
    score = client.zscore(OUTBOX, job_id)
    assert score is not None and since + seconds <= score <= time.time() + seconds, score


def test_a_task_taken_within_the_claim_grace_is_left_to_its_taker(client: redis.Redis) -> None:
    """A worker that took the task a second ago is about to claim the job: putting the task back
    would deliver it twice. The job's next check moves to when that worker's grace runs out."""
    store = JobStore(client)
    _queued(client, "j1")
    client.zadd(OUTBOX, {"j1": 100.0})
    _taken(client, "j1", "tag-1", at=995.0)
    timing = DispatchTiming(grace=5.0, claim_grace=30.0, recheck=60.0)
    assert dispatch_once(store, timing, now=1000.0) == []
    assert client.zscore(OUTBOX, "j1") == 995.0 + 30.0
    assert client.hexists(RedisChannel.unacked_key, "tag-1")  # not put back
    assert client.llen("cpu") == 0


def test_a_task_waiting_in_its_queue_is_left_there_and_the_next_job_still_looked_at(
    client: redis.Redis, sent: list[tuple[str, str]]
) -> None:
    """A task in its queue is on its way to a worker: nothing to do but look again after
    `recheck` (the hold `take_due` put on the entry). A job due after it is still looked at."""
    store = JobStore(client)
    for due, job_id in enumerate(("waiting", "lost")):
        _queued(client, job_id)
        client.zadd(OUTBOX, {job_id: float(due)})
    client.lpush("cpu", json.dumps({"body": "", "headers": {"id": "waiting"}, "properties": {}}))
    timing = DispatchTiming(grace=5.0, claim_grace=30.0, recheck=60.0)
    before = time.time()
    assert dispatch_once(store, timing) == ["lost"]
    assert sent == [("lost", "cpu")]
    assert_due_in(client, "waiting", 60.0, before)
    assert client.llen("cpu") == 1  # the waiting task, untouched


def test_the_dispatcher_ticks_on_its_own_interval_not_the_reapers(client: redis.Redis) -> None:
    """With a reaper interval of a minute, the dispatcher still looks every `timing.interval`
    (0.1 s here): a due entry of a job that is no longer queued is gone within a second."""
    store = JobStore(client)
    _queued(client, "done", status="succeeded")
    client.zadd(OUTBOX, {"done": 0.0})
    stop = start_reaper(
        store,
        interval=60.0,
        max_worker_losses=0,
        outage_hold=0.0,
        timing=DispatchTiming(grace=0.2, claim_grace=1.0, recheck=1.0),
    )
    try:
        deadline = time.monotonic() + 3.0
        while client.zscore(OUTBOX, "done") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.zscore(OUTBOX, "done") is None
    finally:
        stop.set()


def test_a_task_sent_for_a_job_seen_nowhere_is_looked_at_again_a_grace_later(
    client: redis.Redis, sent: list[tuple[str, str]]
) -> None:
    """A queued job whose task is nowhere in the broker (its sender died) gets one sent, and
    its next check `grace` later: soon enough to see the task lost again, late enough not to
    send a second one before a worker took the first. Sending is Celery's `send_task`, stood in
    for here (the end-to-end path is tests/integration/test_outbox.py's)."""
    store = JobStore(client)
    _queued(client, "j2")
    client.zadd(OUTBOX, {"j2": 0.0})
    timing = DispatchTiming(grace=5.0, claim_grace=30.0, recheck=60.0)
    before = time.time()
    assert dispatch_once(store, timing) == ["j2"]
    assert sent == [("j2", "cpu")]
    assert_due_in(client, "j2", 5.0, before)


def test_dispatch_timing_from_the_settings() -> None:
    """A task taken without a claim is its taker's for the grace or the lease, whichever is
    longer; a job with nothing to act on is looked at again after six graces at least."""
    settings = Settings(_env_file=None, outbox_grace_seconds=10.0, lease_seconds=30.0)  # type: ignore[call-arg]
    timing = DispatchTiming.from_settings(settings)
    assert (timing.grace, timing.claim_grace, timing.recheck) == (10.0, 30.0, 60.0)
    # The dispatcher's tick: half a grace, so that a due entry is acted on well within its
    # grace, and never over a second (a lost task is sent again within seconds).
    assert timing.interval == 1.0
    assert DispatchTiming(grace=0.5, claim_grace=1.0, recheck=3.0).interval == 0.25
    short = Settings(_env_file=None, outbox_grace_seconds=2.0, lease_seconds=30.0)  # type: ignore[call-arg]
    assert DispatchTiming.from_settings(short).recheck == 30.0


@pytest.mark.parametrize("ago", [100.0, 30.0], ids=["past-the-grace", "a-whole-grace"])
def test_a_task_whose_taker_died_before_claiming_goes_back_to_the_head_of_its_queue(
    server: RedisServer,
    client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    ago: float,
) -> None:
    """Taken a whole 30 s claim grace ago or longer, and the job still queued: the worker died
    with it. kombu would redeliver it only after its visibility timeout (an hour): the
    dispatcher puts the very message back (kombu's own restore, on this Redis), first in line,
    and looks again a grace later."""
    monkeypatch.setattr(celery_app.conf, "broker_url", server.url())
    store = JobStore(client)
    _queued(client, "j3")
    client.rpush("cpu", json.dumps({"body": "", "headers": {"id": "other"}, "properties": {}}))
    client.zadd(OUTBOX, {"j3": 100.0})
    _taken(client, "j3", "tag-3", at=1000.0 - ago)
    timing = DispatchTiming(grace=5.0, claim_grace=30.0, recheck=60.0)
    with caplog.at_level("WARNING", logger="workers.upkeep.reaper"):
        assert dispatch_once(store, timing, now=1000.0) == ["j3"]
    assert caplog.messages == [
        f"job j3: its task was taken {ago:.0f}s ago by a worker that never claimed the job; put "
        "back in queue cpu"
    ]
    assert not client.hexists(RedisChannel.unacked_key, "tag-3")
    # kombu's consumers BRPOP: the right end of the list is the head of the queue.
    assert [json.loads(raw)["headers"]["id"] for raw in client.lrange("cpu", 0, -1)] == [
        "other",
        "j3",
    ]
    assert client.zscore(OUTBOX, "j3") == 1000.0 + 5.0


def test_a_task_seen_nowhere_is_sent_only_if_a_second_look_still_finds_it_nowhere(
    client: redis.Redis, sent: list[tuple[str, str]]
) -> None:
    """A consumer's BRPOP and its `unacked` write are two commands: a task between them is
    seen nowhere. So the dispatcher looks once more half a second later, and sends only the
    tasks still nowhere whose job is still queued. Here, in that half second, one task is
    taken, one job claimed and one task shows up in its queue; only the fourth is sent (last
    in the outbox's order, so each of the others is passed over, not the end of the look)."""
    store = JobStore(client)
    for due, job_id in enumerate(("taken", "claimed", "waiting", "lost")):
        _queued(client, job_id)
        client.zadd(OUTBOX, {job_id: float(due)})
    taken_at = time.time()

    def meanwhile() -> None:
        _taken(client, "taken", "tag-t", at=taken_at)
        client.hset(job_key("claimed"), "status", "running")
        message = {"body": "", "headers": {"id": "waiting"}, "properties": {}}
        client.lpush("cpu", json.dumps(message))

    timer = threading.Timer(CONFIRM_SECONDS / 2, meanwhile)
    timer.start()
    timing = DispatchTiming(grace=5.0, claim_grace=30.0, recheck=60.0)
    assert dispatch_once(store, timing) == ["lost"]
    timer.join()
    assert sent == [("lost", "cpu")]
    assert client.zscore(OUTBOX, "taken") == taken_at + 30.0  # its taker's grace


@pytest.mark.parametrize("stalled_at_start", [False, True], ids=["redis-up", "redis-stalled"])
def test_a_queued_job_without_an_outbox_entry_is_adopted_and_sent(
    server: RedisServer,
    client: redis.Redis,
    sent: list[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
    stalled_at_start: bool,
) -> None:
    """A job queued before the outbox existed (no entry) is adopted when a worker's reaper
    starts, and its lost task sent. An adoption that Redis did not answer (a stall at the
    worker's start) is tried again at each tick until it succeeds, not given up."""
    store = JobStore(client)
    _queued(client, "old")
    client.sadd(tenant_active_key("t"), "old")
    sleeper = stall(server, 1.0) if stalled_at_start else None
    stop = start_reaper(
        store,
        interval=60.0,
        max_worker_losses=0,
        outage_hold=0.0,
        timing=DispatchTiming(grace=5.0, claim_grace=1.0, recheck=1.0),
    )
    try:
        if sleeper is not None:
            sleeper.join()
        deadline = time.monotonic() + 4.0
        while not sent and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
    assert sent == [("old", "cpu")]
    assert client.zscore(OUTBOX, "old") is not None
    # A stall is logged as such (a warning), not as a bug's traceback.
    failed = "outbox adoption could not reach Redis; retrying" in caplog.messages
    assert failed is stalled_at_start, caplog.messages
    assert not [r for r in caplog.records if r.getMessage().endswith("failed; retrying")]


def test_a_lost_experiment_child_is_sent_again_behind_other_jobs(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher resends a task nobody sent at its job's priority: an experiment's child's
    goes behind plain jobs' (`workers.celery_app.task_priority`) however its task got sent."""
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(
        "workers.upkeep.reaper.enqueue",
        lambda job_id, queue, priority=0: sent.append((job_id, priority)),
    )
    store = JobStore(client)
    for due, job_id in enumerate(("plain", "child")):
        _queued(client, job_id)
        client.zadd(OUTBOX, {job_id: float(due)})
    client.hset(job_key("child"), "experiment", "e1")
    assert dispatch_once(store, DispatchTiming(grace=5.0, claim_grace=30.0, recheck=60.0)) == [
        "plain",
        "child",
    ]
    assert sent == [("plain", 0), ("child", 9)]
