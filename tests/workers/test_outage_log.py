"""A Redis outage in the worker's log: one traceback, then a line every 30 s, then one when it
ends (`workers.upkeep.outage_log`); and the reaper's loops log that way against a real Redis
that is killed and started again."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from pdppo.store import JobStore
from tests.support.stack import RedisServer
from workers.upkeep.outage_log import OutageLog
from workers.upkeep.reaper import DispatchTiming, start_reaper

LOGGER = "tests.outage"


def test_one_traceback_a_line_every_30s_and_one_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    outage = OutageLog("dispatcher", logging.getLogger(LOGGER), clock=lambda: now[0])
    caplog.set_level(logging.WARNING, LOGGER)
    outage.reached()  # nothing to say while Redis answers
    for second in range(66):  # failures at 0, 1, ..., 65 s
        now[0] = 100.0 + second
        outage.failed(redis.ConnectionError(f"refused {second}"))
    now[0] = 166.5
    outage.reached()
    outage.reached()
    assert [(r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("dispatcher could not reach Redis; retrying", True),
        (
            "dispatcher still cannot reach Redis after 30s "
            "(31 attempts; last: ConnectionError: refused 30)",
            False,
        ),
        (
            "dispatcher still cannot reach Redis after 60s "
            "(61 attempts; last: ConnectionError: refused 60)",
            False,
        ),
        ("dispatcher reached Redis again after 66s (66 failed attempts)", False),
    ]
    caplog.clear()
    outage.failed(redis.ConnectionError("again"))  # a new outage starts over
    assert [(r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("dispatcher could not reach Redis; retrying", True),
    ]


def test_the_reaper_logs_a_killed_redis_once_per_loop_not_once_a_second(
    server: RedisServer, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "workers.upkeep.reaper")
    stop = start_reaper(
        JobStore(client),
        interval=0.2,
        max_worker_losses=0,
        outage_hold=0.0,
        timing=DispatchTiming(grace=0.4, claim_grace=1.0, recheck=1.0),  # a pass every 0.2 s
    )
    try:
        time.sleep(0.5)
        server.proc.kill()
        server.proc.wait(10)
        time.sleep(2.5)  # about 12 failed passes of each loop
        failed = [r for r in caplog.records if "could not reach Redis" in r.getMessage()]
        assert sorted(r.getMessage() for r in failed) == [
            "dispatcher could not reach Redis; retrying",
            "reaper could not reach Redis; retrying",
        ]
        assert all(r.exc_info is not None for r in failed)
        assert not [r for r in caplog.records if "still cannot" in r.getMessage()]

        server.restart()
        deadline = time.monotonic() + 10
        while not any("dispatcher reached Redis again" in m for m in caplog.messages):
            assert time.monotonic() < deadline, caplog.messages
            time.sleep(0.05)
    finally:
        stop.set()
