"""The job process's outgoing events through a Redis stall: training does not wait, every event
lands once and in order, and a Redis gone past the outage stops the job instead of failing it."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import redis

from pdppo.store import JobStore, StoreRetry, events_key, metrics_key
from tests.support.seed import TOTAL, running_job, stream
from tests.support.stack import RedisServer, stall
from workers.job.events import EventPublisher, JobCallback, backfill


def test_events_queued_during_a_stall_land_once_in_order(
    server: RedisServer, client: redis.Redis
) -> None:
    store = JobStore(client)
    job = running_job(client)
    publisher = EventPublisher(store, job, StoreRetry(30, base=0.05, cap=0.2))
    publisher.start()
    for step in range(1, 6):
        publisher.step(step, {"loss": float(step)})
    time.sleep(0.3)
    sleeper = stall(server, 1.5)
    started = time.monotonic()
    for step in range(6, TOTAL + 1):
        publisher.step(step, {"loss": float(step)})
        if step % 10 == 0:
            publisher.checkpoint(step, f"step-{step:06d}")
    publisher.log("final model saved to /tmp/final")
    queued_in = time.monotonic() - started
    assert queued_in < 0.1, "the trainer waited on Redis"
    assert sleeper.is_alive()
    assert publisher.close()  # waits for Redis, then for the queue
    assert not sleeper.is_alive()

    rows = [json.loads(row) for row in client.lrange(metrics_key(job.id), 0, -1)]
    assert [row["step"] for row in rows] == list(range(1, TOTAL + 1))
    events = stream(client, job.id)
    assert [d["step"] for t, d in events if t == "metrics"] == list(range(1, TOTAL + 1))
    assert [d["step"] for t, d in events if t == "checkpoint"] == [10, 20, 30, 40]
    assert [d["message"] for t, d in events if t == "log"] == ["final model saved to /tmp/final"]
    # In the trainer's order: the checkpoint right after its step, the log line last.
    kinds = [(t, d.get("step")) for t, d in events if t != "status"]
    assert kinds.index(("checkpoint", 10)) == kinds.index(("metrics", 10)) + 1
    assert kinds[-1] == ("log", None)


def test_a_stopped_redis_makes_should_stop_true_after_the_outage(
    server: RedisServer, client: redis.Redis
) -> None:
    store = JobStore(client)
    job = running_job(client)
    publisher = EventPublisher(store, job, StoreRetry(0.5, base=0.05, cap=0.1))
    ours, theirs = multiprocessing.Pipe()
    callback = JobCallback(publisher, multiprocessing.Event(), theirs)
    publisher.start()
    server.stop()
    callback.on_step(1, {"step": 1.0, "loss": 0.5})
    assert not callback.should_stop()  # Redis has not been away for long yet
    deadline = time.monotonic() + 5
    while not callback.should_stop() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert callback.should_stop()
    assert callback.stop_keeps_work()  # finishes its step and checkpoints it: resumed later
    assert publisher.unavailable is not None and publisher.error is None
    callback.on_step(2, {"step": 2.0, "loss": 0.4})  # dropped, never raises
    assert publisher.close() is False
    assert not ours.poll()  # not a stop the worker asked for: nothing to tell it


def test_a_store_error_that_waiting_cannot_cure_stops_the_job(client: redis.Redis) -> None:
    store = JobStore(client)
    job = running_job(client)
    client.delete(events_key(job.id))
    client.set(events_key(job.id), "not a stream")  # every XADD now fails with WRONGTYPE
    publisher = EventPublisher(store, job, StoreRetry(30))
    publisher.start()
    publisher.step(1, {"loss": 0.5})
    assert publisher.close() is False
    assert isinstance(publisher.error, redis.ResponseError)
    assert publisher.unavailable is None


def test_backfill_publishes_the_checkpointed_steps_redis_never_got(
    client: redis.Redis, tmp_path: Path
) -> None:
    """The last run trained to step 12, checkpointed step 10 and was killed with steps 4-12
    still queued: the resumed run publishes 4-10 (11 and 12 it trains again)."""
    store = JobStore(client)
    job = running_job(client)
    for step in (1, 2, 3):
        store.publish_step(job.id, step, TOTAL, {"loss": float(step)})
    lines = [json.dumps({"step": s, "loss": float(s)}) for s in range(1, 13)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 13, "lo')
    for step in (5, 10):
        ckpt = tmp_path / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "meta.json").write_text(json.dumps({"step": step}))
    resumed = store.get(job.id)
    assert resumed is not None and resumed.step == 3

    publisher = EventPublisher(store, resumed, StoreRetry(30))
    publisher.start()
    assert backfill(publisher, tmp_path, resumed) == 7
    assert publisher.close()

    rows = [json.loads(row) for row in client.lrange(metrics_key(job.id), 0, -1)]
    assert [row["step"] for row in rows] == list(range(1, 11))
    assert rows[-1]["metrics"] == {"loss": 10.0}
    checkpoints = [d for t, d in stream(client, job.id) if t == "checkpoint"]
    assert checkpoints == [{"step": 10, "name": "step-000010"}]
