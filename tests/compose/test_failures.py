"""What an operator does to the deployed stack while jobs run, with compose's own verbs: restart
or stop a worker, kill Redis, take the whole stack down and up again. Nothing a user sent may be
lost and no step may run twice; each test reads the record back over the API."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from tests.compose.stack import TERMINAL, Stack, wait_api, wait_job
from tests.support.specs import smoke_spec
from tests.support.waits import metric_steps, read_events


def long_spec(steps: int, checkpoint_every: int) -> dict[str, Any]:
    """The smoke job made long enough to be caught running (about a second a step)."""
    spec = smoke_spec(steps=steps, checkpoint_every=checkpoint_every, keep_checkpoints=50)
    spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)
    return spec


def submit(client: httpx.Client, spec: dict[str, Any]) -> str:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def at_step(step: int) -> Any:
    return lambda job: job["progress"]["step"] >= step or job["status"] in TERMINAL


def assert_every_step_once(client: httpx.Client, job_id: str, steps: int) -> None:
    history = client.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    assert [row["step"] for row in history] == list(range(1, steps + 1))
    assert metric_steps(read_events(client, job_id)) == list(range(1, steps + 1))


def test_restarting_the_worker_mid_job_resumes_it_with_every_step_once(
    stack: Stack, alice: httpx.Client
) -> None:
    job_id = submit(alice, long_spec(steps=40, checkpoint_every=5))
    caught = wait_job(alice, job_id, at_step(3))
    assert caught["status"] == "running", caught

    stack.run("restart", "worker-cpu")

    done = wait_job(alice, job_id, timeout=300)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2, done
    assert_every_step_once(alice, job_id, 40)
    logs = [e["data"]["message"] for e in read_events(alice, job_id) if e["event"] == "log"]
    assert any(m.startswith("resumed from") for m in logs), logs


def test_stopping_the_worker_checkpoints_the_job_within_the_grace_and_queues_it_again(
    stack: Stack, alice: httpx.Client
) -> None:
    job_id = submit(alice, long_spec(steps=200, checkpoint_every=0))  # no periodic checkpoints
    caught = wait_job(alice, job_id, at_step(3))
    assert caught["status"] == "running", caught

    asked = time.monotonic()
    stack.run("stop", "worker-cpu")
    took = time.monotonic() - asked

    state = stack.inspect("worker-cpu")["State"]
    assert state["ExitCode"] == 0, state  # a warm shutdown, not the SIGKILL after the grace
    assert took < 120, took  # stop_grace_period: 2m
    handed = alice.get(f"/v1/jobs/{job_id}").json()
    assert handed["status"] == "queued", handed
    points = alice.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    assert [c["step"] for c in points] == [handed["progress"]["step"]], (points, handed)
    assert handed["progress"]["step"] >= 3

    cancelled = alice.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    assert wait_job(alice, job_id)["status"] == "cancelled"


def test_killing_redis_loses_no_job_and_no_event(stack: Stack, alice: httpx.Client) -> None:
    finished = submit(alice, long_spec(steps=4, checkpoint_every=0))
    assert wait_job(alice, finished)["status"] == "succeeded"
    before = read_events(alice, finished)
    running = submit(alice, long_spec(steps=30, checkpoint_every=5))
    assert wait_job(alice, running, at_step(3))["status"] == "running"

    stack.run("kill", "-s", "SIGKILL", "redis")
    stack.run("up", "-d", "--no-build", "redis")
    stack.wait_healthy("redis", "api")

    wait_api(alice)
    assert read_events(alice, finished) == before
    done = wait_job(alice, running, timeout=300)
    assert done["status"] == "succeeded", done
    assert_every_step_once(alice, running, 30)
    ids = {job["id"] for job in alice.get("/v1/jobs", params={"limit": 100}).json()["items"]}
    assert {finished, running} <= ids


def test_down_and_up_keeps_jobs_metrics_files_and_checkpoints(
    stack: Stack, alice: httpx.Client
) -> None:
    content = b'{"prompt": "123=", "answer": "321"}\n' * 5
    file = alice.post("/v1/files", files={"file": ("kept.jsonl", content)})
    assert file.status_code == 201, file.text
    job_id = submit(alice, long_spec(steps=4, checkpoint_every=2))
    assert wait_job(alice, job_id)["status"] == "succeeded"
    reads = (
        f"/v1/jobs/{job_id}",
        f"/v1/jobs/{job_id}/metrics",
        f"/v1/jobs/{job_id}/checkpoints",
        f"/v1/files/{file.json()['id']}",
    )
    before = [alice.get(path).json() for path in reads]

    stack.run("down")  # no --volumes: what a redeploy does
    stack.run("up", "-d", "--no-build")
    stack.wait_healthy()
    wait_api(alice)

    assert [alice.get(path).json() for path in reads] == before
    final = alice.get(f"/v1/jobs/{job_id}/model")
    assert final.status_code == 200, final.text
    assert len(final.content) > 10_000
    content_back = alice.get(f"/v1/files/{file.json()['id']}/content")
    assert content_back.content == content


def test_flower_answers_under_the_monitoring_profile(stack: Stack) -> None:
    url = os.environ["PDPPO_COMPOSE_FLOWER_URL"]
    user, password = os.environ["PDPPO_COMPOSE_FLOWER_AUTH"].split(":", 1)
    stack.run("--profile", "monitoring", "up", "-d", "--no-build", "flower")
    try:
        stack.wait_healthy("flower", timeout=120)
        with httpx.Client(base_url=url, timeout=10) as flower:
            assert flower.get("/workers").status_code == 401
            page = flower.get("/workers", auth=(user, password))
            assert page.status_code == 200
            assert "Flower" in page.text
    finally:
        stack.run("--profile", "monitoring", "rm", "--stop", "--force", "flower", check=False)
