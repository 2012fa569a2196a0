"""The webhooks container's healthcheck, as deploy/docker-compose.yml writes it, against a real
webhook worker whose scheduler thread dies or stalls while the process and its Celery node live
on (`faulty_webhook_worker`): healthy before, unhealthy after, though Celery's ping, the whole
of the check before, still answers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.stack import REPO, RedisServer, Service, start_celery_worker

MAX_AGE = 10  # seconds (PDPPO_WORKER_HEALTH_MAX_AGE_SECONDS); a beat is written every 5
PING_ONLY = (
    "import socket, sys; from workers.webhooks import webhook_app as app; "
    "sys.exit(not app.control.ping(['pdppo-webhooks@' + socket.gethostname()], timeout=5))"
)


def compose_check() -> list[str]:
    compose = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    test = compose["services"]["webhooks"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"]
    return [sys.executable, *test[2:]]


def probe(svc: Service, command: list[str]) -> tuple[int, str]:
    done = subprocess.run(
        command, env=svc.env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout.strip()


def wait_probe(svc: Service, command: list[str], code: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        got, message = probe(svc, command)
        if got == code:
            return message
        assert time.monotonic() < deadline, f"the healthcheck still exits {got}: {message}"
        time.sleep(0.5)


@pytest.mark.parametrize("fault", ["kill", "stall"])
def test_the_webhooks_healthcheck_fails_when_its_scheduler_dies_or_stalls(
    tmp_path: Path, fault: str
) -> None:
    redis = RedisServer(tmp_path)
    svc = Service(
        redis,
        tmp_path / "service",
        env={
            "PDPPO_WORKER_HEARTBEAT_DIR": str(tmp_path / "beats"),
            "PDPPO_WORKER_HEALTH_MAX_AGE_SECONDS": str(MAX_AGE),
        },
    )
    control = tmp_path / "control"
    control.mkdir()
    node = f"pdppo-webhooks@{socket.gethostname()}"  # the compose file's `--name ...@%h`
    log_path = tmp_path / "webhooks.log"
    check = compose_check()
    argv = [sys.executable, "-m", "tests.integration.faulty_webhook_worker", str(control), node]
    worker = start_celery_worker(argv, svc.env, log_path)
    try:
        message = wait_probe(svc, check, 0, timeout=30)
        assert message.startswith(f"{node}: webhook scheduler reached Redis"), message

        (control / fault).touch()
        message = wait_probe(svc, check, 1, timeout=MAX_AGE + 30)
        assert message.startswith(f"{node}: webhook scheduler last reached Redis"), message
        assert f"(> {MAX_AGE}s)" in message
        assert (
            f"faulty webhook worker: the scheduler {'thread ends' if fault == 'kill' else 'stalls'}"
            in (log_path.read_text())
        )
        assert worker.poll() is None  # the process lives on
        assert probe(svc, [sys.executable, "-c", PING_ONLY])[0] == 0  # and its node answers
    finally:
        worker.terminate()
        worker.wait(30)
        redis.stop()
