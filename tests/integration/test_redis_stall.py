"""A Redis stall (`DEBUG SLEEP`, as in an fsync pause or a failover) is not a training error.

The job keeps training while Redis does not answer, publishes its steps when Redis is back (in
order, each once) and succeeds on its first attempt. A stall longer than the lease hands the job
on: it resumes from its last checkpoint, publishing first the steps its first run trained during
the stall but could not publish, and its log says the lease expired while Redis was unreachable,
not that its worker was lost.

These tests stall a Redis server of their own, so the shared one never sleeps under other tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.specs import smoke_spec
from tests.support.stack import RedisServer, Service, stall
from tests.support.waits import every_step_once, wait_for, wait_status

STALL_SECONDS = 7  # longer than redis-py's default socket timeout (5 s)
STEPS = 200  # 0.05-0.1 s a step: the stall (from step 5) hits a job in training
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def make_stack(own_redis: RedisServer, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    made: list[Service] = []

    def make(**env: str) -> Service:
        svc = Service(own_redis, tmp_path / f"service-{len(made)}", db=0, env=env)
        made.append(svc)
        svc.start_api()
        svc.start_worker()
        return svc

    yield make
    for svc in made:
        svc.stop()


def trained_steps(svc: Service, job_id: str) -> int:
    """Steps the job process has trained (its metrics.jsonl), whatever Redis has heard of."""
    path = svc.artifact_dir / job_id / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def slow_spec() -> dict[str, Any]:
    spec = smoke_spec(steps=STEPS, checkpoint_every=10, keep_checkpoints=100)
    spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)
    return spec


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="default-timeouts"),
        # Every store call during the stall times out and is retried.
        pytest.param({"PDPPO_REDIS_SOCKET_TIMEOUT_SECONDS": "1"}, id="1s-socket-timeout"),
    ],
)
def test_stall_shorter_than_the_lease_does_not_fail_the_job(
    make_stack: Callable[..., Service], own_redis: RedisServer, env: dict[str, str]
) -> None:
    svc = make_stack(PDPPO_LEASE_SECONDS="30", **env)
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=slow_spec()).json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 5)

        before = trained_steps(svc, job["id"])
        sleeper = stall(own_redis, STALL_SECONDS)
        sleeper.join(STALL_SECONDS + 30)
        assert not sleeper.is_alive()
        during = trained_steps(svc, job["id"]) - before
        running = alice.get(f"/v1/jobs/{job['id']}").json()
        assert running["status"] == "running", "the job ended before the stall did; make it longer"

        done = wait_status(alice, job["id"], TERMINAL, timeout=180)
        assert done["status"] == "succeeded", (done, svc.worker_log()[-3000:])
        assert done["attempts"] == 1
        assert done["error"] is None
        assert done["progress"] == {"step": STEPS, "total": STEPS}
        # Training did not wait for Redis (a step takes ~0.1 s; 7 s of stall is dozens).
        assert during >= 5, during
        events = every_step_once(alice, job["id"], STEPS)
        statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
        assert statuses == ["queued", "running", "succeeded"]
        logs = [e["data"]["message"] for e in events if e["event"] == "log"]
        assert sum(m.startswith("final model saved") for m in logs) == 1, logs


def test_stall_longer_than_the_lease_resumes_the_job_and_says_why(
    make_stack: Callable[..., Service], own_redis: RedisServer
) -> None:
    svc = make_stack(PDPPO_LEASE_SECONDS="3")
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=slow_spec()).json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 5)

        stall(own_redis, STALL_SECONDS).join(STALL_SECONDS + 30)
        done = wait_status(alice, job["id"], TERMINAL, timeout=180)

        assert done["status"] == "succeeded", (done, svc.worker_log()[-3000:])
        assert done["attempts"] == 2
        events = every_step_once(alice, job["id"], STEPS)
        statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
        assert statuses == ["queued", "running", "queued", "running", "succeeded"]
        logs = [e["data"]["message"] for e in events if e["event"] == "log"]
        assert not [m for m in logs if "worker lost" in m], logs
        why = [m for m in logs if m.startswith("lease expired while Redis was unreachable")]
        assert len(why) == 1, logs
        assert sum(m.startswith("resumed from") for m in logs) == 1, logs
