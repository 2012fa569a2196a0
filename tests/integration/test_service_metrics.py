"""`/metrics` on a real stack (Redis, `pdppo serve`, one CPU worker) after a real job: the
service's state reads as known values, and every metric the Grafana dashboard and the alert
rules (deploy/) query is one the app exports."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.monitoring import used_names
from tests.support.specs import smoke_spec
from tests.support.stack import RedisServer, Service, stall
from tests.support.waits import wait_status

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: httpx.Client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def until(client: httpx.Client, ok: Callable[[Samples], bool], timeout: float = 30) -> Samples:
    """Scrape until `ok`: workers flush their counters with their beat, every 5 s."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(client)
        if ok(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


def iso_seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def graded_spec(file_id: str) -> dict[str, Any]:
    """The smoke job on an uploaded file, graded by `string_check`: 3 steps of 4 prompts x 4
    completions, so 48 completions graded, and no evaluation."""
    spec = smoke_spec(steps=3)
    spec["train"]["task"] = {"name": "jsonl", "file": file_id, "grader": {"type": "string_check"}}
    return spec


def test_metrics_after_a_real_job_and_the_names_deploy_uses(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service()  # a database of its own: counts from this test only
    svc.start_api()
    svc.start_worker("cpu")
    with svc.client("alice") as alice, svc.client(None) as anonymous:
        before = scrape(anonymous)
        assert value(before, "pdppo_service_state_up") == 1
        assert (
            value(before, "pdppo_jobs_ended_total", queue="cpu", status="succeeded", code="none")
            == 0
        )

        rows = "".join(
            json.dumps({"prompt": f"copy {i:03d}=", "answer": f"{i:03d}"}) + "\n" for i in range(20)
        )
        uploaded = alice.post("/v1/files", files={"file": ("copy.jsonl", rows.encode())})
        assert uploaded.status_code == 201, uploaded.text
        created = alice.post("/v1/jobs", json=graded_spec(uploaded.json()["id"]))
        assert created.status_code == 201, created.text
        job = wait_status(alice, created.json()["id"], {"succeeded", "failed"}, timeout=180)
        assert job["status"] == "succeeded", job

        m = until(
            anonymous,
            lambda s: (
                value(s, "pdppo_grading_completions_total") == 48
                and (value(s, "pdppo_lease_renewals_total") or 0) > 0
            ),
        )
        assert value(m, "pdppo_service_state_up") == 1
        assert value(m, "pdppo_jobs_ended_total", queue="cpu", status="succeeded", code="none") == 1
        failed = [
            labels
            for (name, labels), v in m.items()
            if name == "pdppo_jobs_ended_total" and dict(labels)["status"] != "succeeded" and v
        ]
        assert failed == []
        assert value(m, "pdppo_queue_depth", queue="cpu") == 0
        assert value(m, "pdppo_jobs", queue="cpu", status="running") == 0
        assert value(m, "pdppo_outbox_depth") == 0
        assert value(m, "pdppo_workers_alive") == 1
        assert value(m, "pdppo_grading_completions_total") == 48
        assert value(m, "pdppo_grading_errors_total") == 0
        assert value(m, "pdppo_grading_timeouts_total") == 0
        assert value(m, "pdppo_lease_losses_total", reason="taken") == 0
        assert value(m, "pdppo_lease_losses_total", reason="unreachable") == 0
        assert value(m, "pdppo_reconciler_actions_total", action="requeued") == 0
        # The lease (2 s) is renewed every 1/3 s while the job runs; wait until a beat (5 s) has
        # flushed the last of them, then compare with the job's running time.
        time.sleep(6)
        renewals = value(scrape(anonymous), "pdppo_lease_renewals_total") or 0
        ran = iso_seconds(job["finished_at"]) - iso_seconds(job["started_at"])
        assert 0.5 * ran * 3 <= renewals <= ran * 3 + 1, (renewals, ran)
        workers = [
            dict(labels)["worker"] for (name, labels) in m if name == "pdppo_worker_running_jobs"
        ]
        assert len(workers) == 1 and value(m, "pdppo_worker_running_jobs", worker=workers[0]) == 0

        exported = {name for name, _ in m}
        families = {name.removesuffix("_total") for name in exported} | exported
        missing = sorted(used_names() - families)
        assert missing == [], f"the dashboard or alerts query metrics /metrics lacks: {missing}"


def test_metrics_answer_promptly_through_a_redis_stall_and_say_the_read_failed(
    tmp_path: Path,
) -> None:
    """A real API on a Redis of its own, put to sleep longer than a scrape may wait."""
    server = RedisServer(tmp_path / "redis")
    svc = Service(server, tmp_path / "service")
    try:
        svc.start_api()
        with svc.client(None) as anonymous:
            assert value(scrape(anonymous), "pdppo_service_state_up") == 1
            sleeper = stall(server, 5)
            started = time.monotonic()
            during = scrape(anonymous)
            took = time.monotonic() - started
            assert took < 2.5, took
            assert value(during, "pdppo_service_state_up") == 0
            assert value(during, "pdppo_workers_alive") is None  # no value, not a stale one
            # the API's own metrics are still served (the first scrape counted once it ended)
            assert (
                value(
                    during,
                    "pdppo_http_requests_total",
                    method="GET",
                    route="/metrics",
                    status="200",
                )
                == 1
            )
            sleeper.join()
            after = scrape(anonymous)
            assert value(after, "pdppo_service_state_up") == 1
            assert value(after, "pdppo_workers_alive") == 0
    finally:
        svc.stop()
        server.stop()
