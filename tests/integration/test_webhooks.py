"""Webhooks on the real stack: redis-server, `pdppo serve`, a CPU worker and `pdppo
webhook-worker`, delivering to a local receiver (`webhook_receiver`) that checks every
signature with the `standardwebhooks` library, the one receivers use.

The service allows 127.0.0.0/8 (PDPPO_WEBHOOK_ALLOWED_NETWORKS: loopback is refused by default)
and retries after 1, 1 and 1 s with 2 s attempts, so that a day's schedule plays out in seconds.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.specs import smoke_spec
from tests.support.stack import RedisServer, Service
from tests.support.waits import read_events, wait_status
from tests.support.webhook_receiver import Received, Receiver

ENV = {
    "PDPPO_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
    "PDPPO_WEBHOOK_RETRY_SCHEDULE": "1,1,1",
    "PDPPO_WEBHOOK_TIMEOUT_SECONDS": "2",
    "PDPPO_WEBHOOK_RESEND_SECONDS": "10",
}


@pytest.fixture(scope="module")
def hooks(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One service with a webhook worker, on a database of its own (as `make_service` picks)."""
    db = 1 + len(list(tmp_path_factory.getbasetemp().glob("extra*")))
    svc = Service(redis_server, tmp_path_factory.mktemp("extra"), db=db, env=ENV)
    try:
        svc.start_api()
        svc.start_worker("cpu")
        svc.start_webhook_worker()
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    made = Receiver(failures=2, hang_seconds=20)
    made.start()
    yield made
    made.stop()


def register(client: httpx.Client, url: str, events: list[str]) -> dict[str, Any]:
    answer = client.post("/v1/webhooks", json={"url": url, "events": events})
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def arrivals(receiver: Receiver, path: str, done: Any, timeout: float = 30) -> list[Received]:
    """What `path` received, once `done(received)` holds."""
    deadline = time.monotonic() + timeout
    while not done(got := receiver.at(path)):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} received only {[r.body for r in got]}")
        time.sleep(0.05)
    return got


def verified(secret: str, got: Received) -> dict[str, Any]:
    return dict(Webhook(secret).verify(got.body, got.headers))


def cancelled_job(client: httpx.Client) -> str:
    job = client.post("/v1/jobs", json=smoke_spec(steps=200)).json()["id"]
    client.post(f"/v1/jobs/{job}/cancel")
    wait_status(client, job, "cancelled")
    return str(job)


def delivery(client: httpx.Client, hook: str, message: str, timeout: float = 30) -> dict[str, Any]:
    """The delivery once settled: the receiver sees a request before its sender records it."""
    deadline = time.monotonic() + timeout
    while True:
        answer = client.get(f"/v1/webhooks/{hook}/deliveries/{message}")
        assert answer.status_code == 200, answer.text
        if answer.json()["status"] != "pending" or time.monotonic() > deadline:
            return dict(answer.json())
        time.sleep(0.1)


def test_every_event_of_a_job_arrives_signed_and_to_its_tenant_only(
    hooks: Service, receiver: Receiver
) -> None:
    types = ["job.queued", "job.running", "job.checkpoint", "job.succeeded"]
    types.append("fine_tuning.job.succeeded")
    with hooks.client("alice") as alice, hooks.client("bob") as bob:
        hook = register(alice, f"{receiver.url}/ok?t=signed", types)
        register(bob, f"{receiver.url}/ok?t=bob", [*types, "job.failed", "job.cancelled"])
        job = alice.post("/v1/jobs", json=smoke_spec(steps=4, checkpoint_every=2)).json()["id"]
        wait_status(alice, job, "succeeded", timeout=120)
        events = read_events(alice, job)
        checkpoints = [e["data"]["step"] for e in events if e["event"] == "checkpoint"]
        expected = len(types) - 1 + len(checkpoints)

        got = arrivals(receiver, "/ok?t=signed", lambda got: len(got) >= expected)
        time.sleep(1.0)  # nothing more may come
        got = receiver.at("/ok?t=signed")
        bodies = [verified(hook["secret"], one) for one in got]
        listed = alice.get(f"/v1/webhooks/{hook['id']}/deliveries", params={"limit": 100}).json()

    assert len(got) == expected
    by_type: dict[str, list[dict[str, Any]]] = {}
    for body in bodies:
        by_type.setdefault(body["type"], []).append(body)
    assert sorted(by_type) == sorted(types)
    # deliveries run side by side and are not ordered (docs/users/webhooks.md): each
    # checkpoint once, in any order
    steps = sorted(b["data"]["checkpoint"]["step"] for b in by_type["job.checkpoint"])
    assert steps == sorted(checkpoints)
    ended = by_type["job.succeeded"][0]["data"]
    assert (ended["id"], ended["status"], ended["step"], ended["total_steps"]) == (
        job,
        "succeeded",
        4,
        4,
    )
    queued = by_type["job.queued"][0]["data"]
    assert (queued["status"], queued["step"], queued["total_steps"]) == ("queued", 0, 4)
    openai_event = by_type["fine_tuning.job.succeeded"][0]
    assert openai_event["object"] == "event"
    assert openai_event["data"] == {"id": f"ftjob-{job}"}
    ids = [one.headers["webhook-id"] for one in got]
    assert len(set(ids)) == len(ids)
    assert receiver.at("/ok?t=bob") == []  # bob's endpoint hears nothing of alice's jobs
    with pytest.raises(WebhookVerificationError):  # the check can fail: a changed body does
        Webhook(hook["secret"]).verify(got[0].body + b" ", got[0].headers)
    items = listed["items"]
    assert sorted(item["id"] for item in items) == sorted(ids)
    assert {(item["status"], item["attempts"]) for item in items} == {("delivered", 1)}


def test_a_receiver_failing_then_recovering_gets_the_event_once_it_answers(
    hooks: Service, receiver: Receiver
) -> None:
    with hooks.client("alice") as alice:
        hook = register(alice, f"{receiver.url}/flaky?t=recover", ["job.cancelled"])
        job = cancelled_job(alice)
        got = arrivals(receiver, "/flaky?t=recover", lambda got: len(got) >= 3)
        message = got[0].headers["webhook-id"]
        record = delivery(alice, hook["id"], message)

    assert [one.status for one in got] == [500, 500, 200]
    assert {one.headers["webhook-id"] for one in got} == {message}
    assert all(verified(hook["secret"], one)["data"]["id"] == job for one in got)
    assert got[1].at - got[0].at >= 0.9 and got[2].at - got[1].at >= 0.9  # the schedule: 1, 1
    assert (record["status"], record["attempts"], record["last_status_code"]) == (
        "delivered",
        3,
        200,
    )
    assert [attempt["status_code"] for attempt in record["history"]] == [500, 500, 200]


def test_a_receiver_that_never_answers_slows_neither_the_api_nor_others(
    hooks: Service, receiver: Receiver
) -> None:
    with hooks.client("alice") as alice:
        stuck = register(alice, f"{receiver.url}/hang?t=slow", ["job.cancelled"])
        fine = register(alice, f"{receiver.url}/ok?t=beside", ["job.cancelled"])
        cancelled_job(alice)
        ended = time.time()
        beside = arrivals(receiver, "/ok?t=beside", lambda got: len(got) >= 1)
        arrivals(receiver, "/hang?t=slow", lambda got: True, timeout=1)  # noted on its answer
        latencies = []
        for _ in range(10):  # while the stuck receiver holds a delivery thread
            started = time.monotonic()
            assert alice.get("/v1/webhooks").status_code == 200
            latencies.append(time.monotonic() - started)
        trained = alice.post("/v1/jobs", json=smoke_spec(steps=2)).json()["id"]
        wait_status(alice, trained, "succeeded", timeout=120)
        deadline = time.monotonic() + 30
        while True:
            listed = alice.get(f"/v1/webhooks/{stuck['id']}/deliveries").json()["items"]
            if (listed and listed[0]["status"] == "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.2)

    assert beside[0].at - ended < 5, "the other endpoint waited behind the stuck one"
    assert max(latencies) < 1.0
    assert fine["id"] != stuck["id"]
    assert (listed[0]["status"], listed[0]["attempts"]) == ("failed", 4)  # 1 + 3 retries
    errors = [attempt["error"] for attempt in listed[0]["history"]]
    assert all("ReadTimeout" in error for error in errors), errors
    assert all(1.8 <= a["duration_ms"] / 1000 < 4 for a in listed[0]["history"])


def test_a_webhook_worker_killed_mid_delivery_loses_no_event(
    hooks: Service, receiver: Receiver
) -> None:
    with hooks.client("alice") as alice:
        hook = register(alice, f"{receiver.url}/stall-once?t=kill", ["job.cancelled"])
        job = cancelled_job(alice)
        assert receiver.arrived.wait(30), "the delivery never started"
        webhook_worker = hooks.workers[-1]
        hooks.kill_worker(webhook_worker)  # mid-attempt: the receiver holds the request
        receiver.release.set()
        hooks.start_webhook_worker()
        got = arrivals(receiver, "/stall-once?t=kill", lambda got: any(r.status for r in got))
        message = got[-1].headers["webhook-id"]
        record = delivery(alice, hook["id"], message)

    answered = [one for one in got if one.status == 200]
    assert len(answered) == 1 and verified(hook["secret"], answered[0])["data"]["id"] == job
    assert {one.headers["webhook-id"] for one in got} == {message}  # the same event, again
    assert (record["status"], record["attempts"]) == ("delivered", 1)  # the killed one: none


def test_a_stopped_webhook_worker_stops_its_scheduler_first(hooks: Service) -> None:
    """A warm shutdown (SIGTERM) stops taking due deliveries before the pool stops: one taken
    then would wait out its hold before a live worker could send it."""
    webhook_worker = hooks.workers[-1]
    log_name = f"webhooks-{len(hooks.workers) - 1}.log"
    assert "webhook scheduler: started" in hooks.tail(log_name, 100_000)
    webhook_worker.send_signal(signal.SIGTERM)
    webhook_worker.wait(30)
    assert "webhook scheduler: stopped" in hooks.tail(log_name, 100_000)
