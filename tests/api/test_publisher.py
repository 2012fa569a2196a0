"""The API's task publisher: in order, never blocking the caller, a failure left to the outbox."""

from __future__ import annotations

import threading
import time

from api.jobs.publisher import TaskPublisher


def test_publishes_in_order_and_goes_on_after_a_failure() -> None:
    sent: list[tuple[str, str, int]] = []

    def publish(job_id: str, queue: str, priority: int) -> None:
        if job_id == "bad":
            raise ConnectionError("broker down")
        sent.append((job_id, queue, priority))

    publisher = TaskPublisher(publish)
    for job_id in ("a", "bad", "b"):
        publisher.submit(job_id, "cpu")
    publisher.submit("c", "cpu", 9)
    publisher.close()
    assert sent == [("a", "cpu", 0), ("b", "cpu", 0), ("c", "cpu", 9)]


def test_submit_returns_while_a_publish_blocks() -> None:
    release = threading.Event()
    sent: list[str] = []

    def publish(job_id: str, queue: str, priority: int) -> None:
        release.wait(10)
        sent.append(job_id)

    publisher = TaskPublisher(publish)
    started = time.monotonic()
    for i in range(100):
        publisher.submit(str(i), "gpu")
    assert time.monotonic() - started < 1.0  # the caller (the event loop) never waited
    assert sent == []
    release.set()
    publisher.close()
    assert sent == [str(i) for i in range(100)]


def test_close_gives_up_after_its_timeout() -> None:
    stuck = threading.Event()
    publisher = TaskPublisher(lambda job_id, queue, priority: stuck.wait(30) and None)
    publisher.submit("x", "cpu")
    started = time.monotonic()
    publisher.close(timeout=0.2)
    assert time.monotonic() - started < 2.0
    stuck.set()
