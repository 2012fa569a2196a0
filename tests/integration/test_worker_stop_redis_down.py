"""A training worker told to stop (SIGTERM, as `docker stop` or `pdppo dev` sends) while its Redis
is down exits within a bounded time, and the job it was running is not lost.

Seen once under `pdppo dev`: a worker printed "Warm shutdown" and ran on for 16 minutes, deaf to
SIGTERM, its main thread in Celery's event heartbeat (`celery.worker.heartbeat`), which publishes
with `retry=True` and no retry limit: against a closed port kombu reconnects forever, against a
stalled server it waits forever for the reply, and the shutdown flag is never read. Without the
heartbeat, the shutdown itself waited forever on a stalled server (closing the control channel):
kombu's Redis transport has no socket timeout unless given one.

The other way round, a worker not told to stop must not stop: one whose job ended while Redis
was down (so that its task's ack failed) exited with "Unrecoverable error: AttributeError" at its
first reconnect, Celery 5.7 tearing the broker connection down twice (`workers.consumer`).

Each test has a redis-server of its own: it is killed, restarted or stopped (SIGSTOP, a stall
that lasts until SIGCONT).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.specs import smoke_spec
from tests.support.stack import RedisServer, Service
from tests.support.waits import every_step_once, wait_for, wait_status

# Short store and broker timeouts, so that a worker that does stop does so in seconds; with them
# it stops in about 2-10 s here, and before the fix it never did.
ENV = {"PDPPO_REDIS_SOCKET_TIMEOUT_SECONDS": "2", "PDPPO_STORE_OUTAGE_SECONDS": "5"}
EXIT_LIMIT = 45.0  # seconds from SIGTERM to exit
HEARTBEAT_DUE = 3.0  # past Celery's event heartbeat interval (2 s): it has fired meanwhile
STEPS = 200
TERMINAL = {"succeeded", "failed", "cancelled"}


def seconds_to_exit(
    worker: subprocess.Popen[bytes], svc: Service, log: str = "worker-0.log"
) -> float:
    """SIGTERM, then how long the worker took to exit (rc 0); fails past EXIT_LIMIT."""
    sent = time.monotonic()
    worker.terminate()
    try:
        code = worker.wait(EXIT_LIMIT)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(10)
        raise AssertionError(
            f"worker still running {EXIT_LIMIT:.0f}s after SIGTERM with Redis down: "
            + svc.tail(log, 3000)
        ) from None
    assert code == 0, svc.tail(log, 3000)
    return time.monotonic() - sent


@contextmanager
def stalled(redis: RedisServer) -> Iterator[None]:
    """Redis stopped (SIGSTOP): connections open, nothing answered, until the block ends."""
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)


def slow_spec() -> dict[str, Any]:
    spec = smoke_spec(steps=STEPS, checkpoint_every=10, keep_checkpoints=100)
    spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)
    return spec


def kill_redis_under_a_job(svc: Service, redis: RedisServer, alice: httpx.Client) -> str:
    """A long job started and past step 3, then Redis killed (its port closed); the job's id."""
    job = alice.post("/v1/jobs", json=slow_spec()).json()
    wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 3)
    redis.proc.kill()
    redis.proc.wait(10)
    return str(job["id"])


def wait_worker_log(
    svc: Service, done: Callable[[str], bool], worker: subprocess.Popen[bytes] | None = None
) -> str:
    """The worker's log once `done(log)` holds (60 s at most; fails at once if `worker` exits)."""
    deadline = time.monotonic() + 60
    while not done(log := svc.worker_log()):
        assert time.monotonic() < deadline, log[-3000:]
        assert worker is None or worker.poll() is None, log[-3000:]
        time.sleep(0.2)
    return log


@pytest.mark.parametrize("kind", ["worker", "webhook-worker"])
def test_idle_worker_stops_while_redis_is_stalled(
    own_redis: RedisServer, tmp_path: Path, kind: str
) -> None:
    """Also the webhook worker: it sends no event heartbeat, but its shutdown closes the same
    kind of broker channel."""
    svc = Service(own_redis, tmp_path / "service", env=ENV)
    try:
        worker = svc.start_worker() if kind == "worker" else svc.start_webhook_worker()
        log = "worker-0.log" if kind == "worker" else "webhooks-0.log"
        time.sleep(HEARTBEAT_DUE)
        with stalled(own_redis):
            time.sleep(HEARTBEAT_DUE)
            took = seconds_to_exit(worker, svc, log)
        assert "Warm shutdown" in svc.tail(log, 1_000_000), svc.tail(log, 3000)
        assert took < EXIT_LIMIT
    finally:
        svc.stop()


def test_worker_stops_after_its_job_ended_while_redis_was_gone(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """The case seen under `pdppo dev`: Redis killed (its port closed) under a running job; the
    job gives up on Redis and its worker tries to hand it back until Redis answers (a reaper
    would count the worker lost otherwise, `workers.job.runner._hand_back`), and is told to stop
    meanwhile: it leaves the job to a reaper, the task returns, Celery's timers run again (the
    event heartbeat first) and the worker exits."""
    svc = Service(own_redis, tmp_path / "service", env=ENV)
    try:
        svc.start_api()
        worker = svc.start_worker()
        with svc.client("alice") as alice:
            job_id = kill_redis_under_a_job(svc, own_redis, alice)
        wait_worker_log(svc, lambda log: "could not hand it back yet" in log, worker)
        time.sleep(HEARTBEAT_DUE)

        took = seconds_to_exit(worker, svc)
        assert took < EXIT_LIMIT
        log = svc.worker_log()
        assert "could not hand it back; a reaper will once Redis answers" in log, log[-3000:]
        assert f"Task pdppo.train[{job_id}] succeeded" in log, log[-3000:]
    finally:
        svc.stop()


def test_worker_stops_mid_job_while_redis_is_stalled_and_the_job_resumes(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """Stopped mid-job with Redis stalled, the worker cannot hand the job back: it exits anyway,
    and once Redis answers the next worker resumes the job from its last checkpoint, every step
    published once."""
    svc = Service(own_redis, tmp_path / "service", env=ENV)
    try:
        svc.start_api()
        first = svc.start_worker()
        with svc.client("alice") as alice:
            job = alice.post("/v1/jobs", json=slow_spec()).json()
            wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 15)
            with stalled(own_redis):
                time.sleep(HEARTBEAT_DUE)
                took = seconds_to_exit(first, svc)
            assert took < EXIT_LIMIT
            running = alice.get(f"/v1/jobs/{job['id']}").json()
            assert running["status"] == "running", "the job ended before the stall; make it longer"

            svc.start_worker()
            done = wait_status(alice, job["id"], TERMINAL, timeout=240)
            assert done["status"] == "succeeded", (done, svc.worker_log(1)[-3000:])
            assert done["attempts"] == 2
            assert done["progress"] == {"step": STEPS, "total": STEPS}
            events = every_step_once(alice, job["id"], STEPS)
            logs = [e["data"]["message"] for e in events if e["event"] == "log"]
            assert sum(m.startswith("resumed from") for m in logs) == 1, logs
    finally:
        svc.stop()


def test_worker_whose_redis_died_mid_job_reconnects_and_takes_the_next_job(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """Redis killed under a running job and back (empty, same port) while the worker is still
    trying to hand the job back: the hand-back finds no job, the task returns onto a broker
    connection that died under it, Celery tears that down, and the worker keeps running,
    reconnects and runs the next job.

    Before the hand-back waited for Redis, the task returned while Redis was still away and its
    ack failed ("Couldn't ack"), and the teardown that followed made the worker exit (code 0) at
    its reconnect; that teardown's guard (`workers.consumer`) is tested on real kombu in
    tests/workers/test_consumer.py, since this path no longer reaches it."""
    svc = Service(own_redis, tmp_path / "service", env=ENV)
    try:
        svc.start_api()
        worker = svc.start_worker()
        with svc.client("alice") as alice:
            first = kill_redis_under_a_job(svc, own_redis, alice)
            wait_worker_log(svc, lambda log: "could not hand it back yet" in log, worker)
            own_redis.restart()
            wait_worker_log(svc, lambda log: log.count("Connected to redis") >= 2, worker)

            nxt = alice.post("/v1/jobs", json=smoke_spec(steps=2)).json()
            done = wait_status(alice, nxt["id"], TERMINAL, timeout=120)
        assert done["status"] == "succeeded", svc.worker_log()[-3000:]
        log = svc.worker_log()
        assert f"Task pdppo.train[{nxt['id']}] succeeded" in log, log[-3000:]
        returned = log.index(f"Task pdppo.train[{first}] succeeded")
        assert "Connection to broker lost" in log[returned:], log[-3000:]
        assert "Unrecoverable error" not in log, log[-3000:]
        assert worker.poll() is None
    finally:
        svc.stop()
