"""One delivery attempt (`workers.webhooks.attempt_delivery`) against a real redis-server and a
local receiver answering each status in turn: which answers deliver, which are retried when (the
schedule), when the last retry fails it, that redirects are not followed, and that a URL the
policy refuses (or a closed port) is an attempt that failed, with its reason."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import cast

import pytest
import redis

from pdppo.store.keys import WEBHOOK_DUE
from pdppo.store.webhooks.deliveries import Attempt, WebhookDeliveries
from tests.support.stack import RedisServer, free_port, stall
from tests.support.webhooks import attempt_to, settings, state
from workers import webhooks
from workers.upkeep.heartbeat import Heartbeat, node_beat
from workers.webhooks import attempt_delivery

REDIRECTED: list[str] = []


class Answers(BaseHTTPRequestHandler):
    """`/<status>`: answers that status; a 302 points at /200."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        status = int(self.path.strip("/"))
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(status)
        if status == 302:
            self.send_header("location", "/200")
        self.send_header("content-length", "4")
        self.end_headers()
        self.wfile.write(b"body")


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def again(routes: WebhookDeliveries, attempt: Attempt) -> Attempt:
    """The same delivery's next attempt (its retry, taken as if due)."""
    (sent,) = routes.take_due(30, now=time.time() + 1e6)
    found = routes.begin(*sent, hold_seconds=30)
    assert found is not None
    return found


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_a_2xx_delivers(
    client: redis.Redis, server: RedisServer, receiver: str, status: int
) -> None:
    routes, attempt = attempt_to(client, server, f"{receiver}/{status}")
    assert attempt_delivery(routes, attempt, settings()) == "delivered"
    assert state(client, attempt) == ("delivered", "1", str(status), "")
    assert client.zscore(WEBHOOK_DUE, attempt.id) is None


@pytest.mark.parametrize("status", [300, 302, 400, 410, 500, 503])
def test_anything_else_is_retried_on_the_schedule_then_failed(
    client: redis.Redis, server: RedisServer, receiver: str, status: int
) -> None:
    routes, attempt = attempt_to(client, server, f"{receiver}/{status}")
    before = time.time()
    assert attempt_delivery(routes, attempt, settings("5,300")) == "retry"
    due = cast(float, client.zscore(WEBHOOK_DUE, attempt.id))
    assert before + 5 <= due <= time.time() + 5  # the schedule's first delay
    assert state(client, attempt) == ("pending", "1", str(status), f"HTTP {status}: body")

    second = again(routes, attempt)
    before = time.time()
    assert attempt_delivery(routes, second, settings("5,300")) == "retry"
    due = cast(float, client.zscore(WEBHOOK_DUE, attempt.id))
    assert before + 300 <= due <= time.time() + 300  # its second

    third = again(routes, second)
    assert attempt_delivery(routes, third, settings("5,300")) == "failed"  # no third delay
    assert state(client, attempt) == ("failed", "3", str(status), f"HTTP {status}: body")
    assert client.zscore(WEBHOOK_DUE, attempt.id) is None


def test_a_url_the_policy_refuses_now_is_a_failed_attempt(
    client: redis.Redis, server: RedisServer, receiver: str
) -> None:
    routes, attempt = attempt_to(client, server, f"{receiver}/200")
    assert attempt_delivery(routes, attempt, settings(allowed="")) == "retry"
    status, attempts, code, error = state(client, attempt)
    assert (status, attempts, code) == ("pending", "1", "")
    assert error is not None and error.startswith("refused: '127.0.0.1' resolves to 127.0.0.1")


def test_a_closed_port_is_a_failed_attempt_named_by_its_error(
    client: redis.Redis, server: RedisServer
) -> None:
    routes, attempt = attempt_to(client, server, f"http://127.0.0.1:{free_port()}/200")
    assert attempt_delivery(routes, attempt, settings("1")) == "retry"
    status, _, code, error = state(client, attempt)
    assert (status, code) == ("pending", "")
    assert error is not None and error.startswith("ConnectError: ")


def test_the_scheduler_outlives_a_bug_and_a_stalled_redis_and_then_sends(
    client: redis.Redis,
    server: RedisServer,
    receiver: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    routes, attempt = attempt_to(client, server, f"{receiver}/200")
    routes.record(attempt, "retry", retry_at=time.time() + 1.5, status_code=503)
    sent: list[list[str]] = []
    monkeypatch.setattr(
        webhooks.webhook_app, "send_task", lambda name, args, queue: sent.append(args)
    )
    scheduler = webhooks.Scheduler(routes, settings(), "c1")
    scheduler.bug_pause = scheduler.redis_pause = 0.1
    real_pass = scheduler.pass_once
    calls = iter([RuntimeError("a bug")])

    def flaky_pass(block_ms: int | None = None) -> int:
        for error in calls:
            raise error
        return real_pass(block_ms=block_ms)

    monkeypatch.setattr(scheduler, "pass_once", flaky_pass)
    caplog.set_level("INFO", logger="workers.webhooks")
    scheduler.start()
    try:
        stall(server, 1.0)  # the client gives up on a reply after 0.3 s: RedisErrors
        deadline = time.monotonic() + 15
        while not sent and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        scheduler.stopping.set()
        scheduler.join(5)
    assert [args[0] for args in sent] == [attempt.id]  # once due, and once only
    text = caplog.text
    assert "webhook scheduler: unexpected error; again in 0.1 s" in text
    assert "trying again in 0.1 s" in text  # the stall
    assert "webhook scheduler: stopped" in text


def run_scheduler(
    routes: WebhookDeliveries, heartbeat: Heartbeat, sent: list[list[str]], seconds: float
) -> float:
    """Run a scheduler with `heartbeat` until it sent a task or `seconds` passed: how long."""
    scheduler = webhooks.Scheduler(routes, settings(), "c1", heartbeat)
    started = time.monotonic()
    scheduler.start()
    try:
        while not sent and time.monotonic() - started < seconds:
            time.sleep(0.05)
        return time.monotonic() - started
    finally:
        scheduler.stopping.set()
        scheduler.join(5)


def test_the_scheduler_beats_after_its_passes_and_sends_on_when_it_cannot(
    client: redis.Redis,
    server: RedisServer,
    receiver: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """The beat is what the webhooks container's healthcheck reads (scheduler_healthy). A folder
    it cannot write (here: a file in its place) fails that check, and costs the deliveries
    nothing: a retry due in 1 s is sent then, not after a bug's 5 s pause."""
    routes, attempt = attempt_to(client, server, f"{receiver}/200")
    sent: list[list[str]] = []
    monkeypatch.setattr(
        webhooks.webhook_app, "send_task", lambda name, args, queue: sent.append(args)
    )
    node = "pdppo-webhooks@here"
    assert node_beat(tmp_path / "beats", node) is None
    routes.record(attempt, "retry", retry_at=time.time() + 0.5, status_code=503)
    run_scheduler(routes, Heartbeat(tmp_path / "beats", node), sent, 10)
    assert [args[0] for args in sent] == [attempt.id]
    beat = node_beat(tmp_path / "beats", node)
    assert beat is not None and beat.pid == os.getpid() and beat.age < 5

    routes.record(again(routes, attempt), "retry", retry_at=time.time() + 1)  # due in 1 s
    sent.clear()
    (tmp_path / "blocked").write_text("not a folder")
    caplog.set_level("WARNING", logger="workers.webhooks")
    took = run_scheduler(routes, Heartbeat(tmp_path / "blocked" / "beats", node), sent, 10)
    assert [args[0] for args in sent] == [attempt.id]
    assert 0.9 < took < 3.5
    assert "webhook scheduler: cannot write its heartbeat" in caplog.text
