"""A worker killed with -9 mid-job: the next worker resumes the job from its last checkpoint."""

from __future__ import annotations

from collections.abc import Callable

from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import every_step_once, metric_steps, read_events, wait_for, wait_status

STEPS = 120


def test_job_resumes_on_next_worker_after_kill_9(make_service: Callable[..., Service]) -> None:
    svc = make_service()
    # its own database: on the session service's database 0, that service's worker would take
    # this job, and the kill below would not touch it (it did, in full runs: attempts 1)
    assert not svc.redis_url.endswith("/0")
    svc.start_api()
    first = svc.start_worker()
    with svc.client("alice") as alice:
        spec = smoke_spec(steps=STEPS, checkpoint_every=10, keep_checkpoints=20)
        spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)  # slower steps
        job = alice.post("/v1/jobs", json=spec).json()
        at_kill = wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 25)
        svc.kill_worker(first)
        killed_at = alice.get(f"/v1/jobs/{job['id']}").json()["progress"]["step"]
        assert killed_at < STEPS, "the job finished before the kill; make it longer"

        svc.start_worker()
        done = wait_status(alice, job["id"], {"succeeded", "failed", "cancelled"}, timeout=120)

        assert done["status"] == "succeeded", done
        assert done["attempts"] == 2
        assert done["progress"] == {"step": STEPS, "total": STEPS}
        events = every_step_once(alice, job["id"], STEPS)
        statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
        assert statuses == ["queued", "running", "queued", "running", "succeeded"]
        logs = [e["data"]["message"] for e in events if e["event"] == "log"]
        resumed = [m for m in logs if m.startswith("resumed from")]
        assert len(resumed) == 1, logs
        resumed_at = int(resumed[0].rsplit(" ", 1)[1])
        assert 20 <= resumed_at <= killed_at and resumed_at % 10 == 0
        assert at_kill["progress"]["step"] >= 25


def test_sigterm_hands_the_job_back_and_the_next_worker_finishes_it(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service()
    svc.start_api()
    first = svc.start_worker()
    with svc.client("alice") as alice:
        spec = smoke_spec(steps=STEPS, checkpoint_every=0)  # only the shutdown checkpoints
        spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)
        job = alice.post("/v1/jobs", json=spec).json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 10)

        first.terminate()  # SIGTERM, as `docker stop` sends
        assert first.wait(20) == 0, svc.worker_log(0)[-2000:]
        handed = alice.get(f"/v1/jobs/{job['id']}").json()
        assert handed["status"] == "queued", handed
        points = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
        assert [c["step"] for c in points] == [handed["progress"]["step"]]

        svc.start_worker()
        done = wait_status(alice, job["id"], {"succeeded", "failed", "cancelled"}, timeout=120)
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 2
        events = read_events(alice, job["id"])
        assert metric_steps(events) == list(range(1, STEPS + 1))
        logs = [e["data"]["message"] for e in events if e["event"] == "log"]
        assert any(m.startswith("worker shutting down") for m in logs), logs
