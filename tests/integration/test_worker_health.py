"""`pdppo healthcheck` against a real worker: healthy once its reaper thread has reached Redis,
unhealthy when Redis goes away (after the allowed age) and when the worker itself is gone.
This is the worker containers' healthcheck in deploy/docker-compose.yml."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.support.stack import RedisServer, Service, pdppo_command


def healthcheck(svc: Service) -> tuple[int, str]:
    done = subprocess.run(
        [*pdppo_command(), "healthcheck"], env=svc.env, capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout.strip()


def wait_health(svc: Service, code: int, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        got, message = healthcheck(svc)
        if got == code:
            return message
        assert time.monotonic() < deadline, f"healthcheck still {got}: {message}"
        time.sleep(0.5)


def test_a_worker_is_healthy_while_it_reaches_redis_and_not_after(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)
    svc = Service(
        redis,
        tmp_path / "service",
        env={
            "PDPPO_WORKER_HEARTBEAT_DIR": str(tmp_path / "beats"),
            "PDPPO_WORKER_HEALTH_MAX_AGE_SECONDS": "4",
        },
    )
    try:
        assert healthcheck(svc) == (1, "no worker process has reached Redis yet")
        worker = svc.start_worker()
        message = wait_health(svc, 0)
        assert message.startswith("1 worker process(es) alive; Redis reached"), message
        assert [p.name for p in (tmp_path / "beats").iterdir()] == [
            f"{os.uname().nodename}_{worker.pid}"  # host:pid, as a file name
        ]

        redis.stop()  # the worker lives on, but can reach nothing
        message = wait_health(svc, 1, timeout=30)
        assert message.startswith("last reached Redis more than 4s ago"), message

        svc.kill_worker(worker)
        assert healthcheck(svc) == (1, "no worker process has reached Redis yet")
    finally:
        svc.stop()
        redis.stop()
