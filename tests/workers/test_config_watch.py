"""The job process's view of its steering changes (`workers.job.config_watch`), on a real Redis:
the newest change in memory without a wait, a change made while queued applied from the start,
a stall survived by the poll thread, the pace of its reads. End to end (PATCH to metrics):
tests/integration/test_steering.py."""

from __future__ import annotations

import json
import time

import redis

from pdppo.store import job_key
from pdppo.store.jobs.steering import Steering
from tests.support.stack import RedisServer, stall
from workers.job.config_watch import POLL_SECONDS, ConfigWatch


def change(client: redis.Redis, job_id: str, version: int, overrides: object) -> None:
    """What `PATCH /v1/jobs/{id}` leaves in the job hash (the API's script, its fields only)."""
    client.hset(
        job_key(job_id), mapping={"config_version": version, "overrides": json.dumps(overrides)}
    )


def wait_for(watch: ConfigWatch, version: int, within: float) -> None:
    deadline = time.monotonic() + within
    while (watch.latest() or (0, {}))[0] < version:
        assert time.monotonic() < deadline, f"version {version} not seen: {watch.latest()}"
        time.sleep(0.02)


def test_a_change_made_while_queued_applies_from_the_first_step(client: redis.Redis) -> None:
    change(client, "j1", 2, {"train": {"learning_rate": 0.1}})
    watch = ConfigWatch(Steering(client), "j1")
    watch.start()
    try:
        assert watch.latest() == (2, {"learning_rate": 0.1})  # read before the first step
        change(client, "j1", 3, {"train": {"learning_rate": 0.2, "beta": 0.5}})
        wait_for(watch, 3, within=POLL_SECONDS + 1)
        assert watch.latest() == (3, {"learning_rate": 0.2, "beta": 0.5})
    finally:
        watch.stop()


def test_no_change_yet_is_none_and_a_change_without_train_overrides_nothing(
    client: redis.Redis,
) -> None:
    watch = ConfigWatch(Steering(client), "j2")
    watch.start()
    try:
        assert watch.latest() is None  # nothing to apply: the spec as submitted
        change(client, "j2", 1, {"lr_schedule": "cosine"})  # no `train` part: nothing of it
        wait_for(watch, 1, within=POLL_SECONDS + 1)
        assert watch.latest() == (1, {})
        change(client, "j2", 2, {"train": ["not", "an", "object"]})
        wait_for(watch, 2, within=POLL_SECONDS + 1)
        assert watch.latest() == (2, {})
    finally:
        watch.stop()


def test_reads_that_fail_in_a_stall_keep_the_last_change_and_polling_goes_on(
    server: RedisServer, client: redis.Redis
) -> None:
    change(client, "j3", 1, {"train": {"learning_rate": 0.1}})
    watch = ConfigWatch(Steering(client), "j3")
    watch.start()
    try:
        stall(server, 1.5).join()  # every read in it times out (0.3 s)
        assert watch.latest() == (1, {"learning_rate": 0.1})
        change(client, "j3", 2, {"train": {"learning_rate": 0.3}})
        wait_for(watch, 2, within=POLL_SECONDS + 1)
        assert watch.latest() == (2, {"learning_rate": 0.3})
    finally:
        watch.stop()


class CountedReads:
    """A stand-in for the one call the watch makes (`Steering.config`): no change, counted."""

    def __init__(self) -> None:
        self.reads = 0

    def config(self, job_id: str) -> tuple[int, dict[str, object]]:
        self.reads += 1
        return 0, {}


def test_the_config_is_read_at_the_start_then_twice_a_second() -> None:
    """A change reaches the trainer within half a second, for two reads of Redis a second per
    job. In seconds, not in POLL_SECONDS: a bound in its terms follows it."""
    steering = CountedReads()
    watch = ConfigWatch(steering, "j4")  # type: ignore[arg-type]
    watch.start()
    assert steering.reads == 1
    time.sleep(2.1)
    watch.stop()
    assert 4 <= steering.reads <= 5
