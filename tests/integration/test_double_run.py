"""A job runs in one place at a time, however often its task is delivered (README: "a redelivered
task never runs a job twice").

Celery delivers at least once, so a job's task can reach a second worker while the first still
trains it: a duplicate publish (a sender that retried), or a redelivery after the first worker
seemed dead. Two real workers, one job:

1. its task is published again while the first worker trains it: the second worker finds the
   lease held and skips the task (no claim, no job process of its own);
2. the first worker is frozen (SIGSTOP, its job process with it) until its lease expires: a
   reaper queues the job again and the second worker resumes it; when the first wakes up, it
   sees its lease gone and kills its own job process before it writes anything.

Throughout, exactly one job process trains the job, the lease names the worker that does, and
the job succeeds with every step published once, in order.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis
from celery import Celery
from kombu import Queue

from pdppo.store import job_key, lease_key
from tests.integration.conftest import TERMINAL, metric_steps, read_events, wait_for, wait_status
from tests.integration.stack import Service, smoke_spec
from workers.celery_app import TRAIN_TASK

STEPS = 150
CHECKPOINT_EVERY = 10


def publish_again(redis_url: str, job_id: str) -> None:
    """The job's task, sent once more exactly as `workers.celery_app.enqueue` sends it."""
    app = Celery("duplicate", broker=redis_url)
    app.conf.update(task_queues=[Queue("cpu")], task_serializer="json")
    try:
        app.send_task(TRAIN_TASK, args=[job_id], queue="cpu", task_id=job_id)
    finally:
        app.close()


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def job_processes(worker: subprocess.Popen[bytes]) -> list[int]:
    """The worker's job processes: children of its fork server (`workers.job_process`)."""
    found = []
    for child in _children(worker.pid):
        try:
            cmdline = (Path("/proc") / str(child) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"forkserver" in cmdline:
            found += [pid for pid in _children(child) if _alive(pid)]
    return found


def _alive(pid: int) -> bool:
    """Running or stopped, not a zombie waiting for its parent to reap it."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def claimed_by(client: redis.Redis, job_id: str) -> str:
    """The worker that claimed the job last, as `host:pid` (the record's `worker` field)."""
    return str(client.hget(job_key(job_id), "worker"))


def freeze(worker: subprocess.Popen[bytes]) -> list[int]:
    """SIGSTOP the worker and its job processes, as when its machine pauses (a job process is
    in a session of its own, so a signal to the worker's group misses it); returns the job
    processes frozen."""
    jobs = job_processes(worker)
    for pid in jobs:
        os.kill(pid, signal.SIGSTOP)
    os.killpg(worker.pid, signal.SIGSTOP)
    return jobs


def thaw(worker: subprocess.Popen[bytes], jobs: list[int]) -> None:
    os.killpg(worker.pid, signal.SIGCONT)
    for pid in jobs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def lease_owner(client: redis.Redis, job_id: str) -> str:
    """The worker holding the job's lease, as `host:pid` (a token is `host:pid:<random>`)."""
    token = client.get(lease_key(job_id))
    assert token is not None, f"nobody holds the lease of {job_id}"
    return str(token).rsplit(":", 1)[0]


def holder(svc: Service, client: redis.Redis, job_id: str) -> int:
    """Index (in svc.workers) of the worker that claimed the job last."""
    pid = int(claimed_by(client, job_id).rsplit(":", 1)[1])
    return next(i for i, w in enumerate(svc.workers) if w.pid == pid)


def wait_until(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_redelivered_task_never_runs_a_job_twice_at_once(
    make_service: Callable[..., Service],
) -> None:
    """Protects the lease in `workers.runner`: `run_job` skipping a task whose lease is held
    (acquire must fail while another worker holds it), and `_supervise` checking the lease while
    the job trains (a worker whose lease expired must kill its job process)."""
    svc = make_service()
    svc.start_api()
    svc.start_worker()
    svc.start_worker()
    client = redis.Redis.from_url(svc.redis_url, decode_responses=True)
    spec = smoke_spec(steps=STEPS, checkpoint_every=CHECKPOINT_EVERY, keep_checkpoints=3)
    spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)  # slower steps
    with svc.client("alice") as alice:
        job_id = alice.post("/v1/jobs", json=spec).json()["id"]
        frozen: tuple[subprocess.Popen[bytes], list[int]] | None = None
        try:
            job = wait_for(alice, job_id, lambda j: j["progress"]["step"] >= 3)
            first = holder(svc, client, job_id)
            second = 1 - first
            a, b = svc.workers[first], svc.workers[second]
            assert len(job_processes(a)) == 1 and job_processes(b) == []

            # 1. A duplicate of the task, while the first worker trains the job.
            publish_again(svc.redis_url, job_id)
            said = f"job {job_id}: "
            wait_until("the second worker to take the task", lambda: said in svc.worker_log(second))
            time.sleep(0.5)  # a worker that wrongly went on would start the job within this
            lines = [x for x in svc.worker_log(second).splitlines() if said in x]
            assert [x.split(said, 1)[1] for x in lines] == [
                "skipped: another worker holds the lease"
            ], lines
            job = alice.get(f"/v1/jobs/{job_id}").json()
            assert job["status"] == "running" and job["attempts"] == 1, job
            assert holder(svc, client, job_id) == first
            assert len(job_processes(a)) == 1 and job_processes(b) == []
            assert lease_owner(client, job_id) == claimed_by(client, job_id)

            # 2. The first worker freezes past its lease; the second resumes the job.
            frozen = (a, freeze(a))
            time.sleep(0.5)  # what was in flight when it froze has landed
            at_freeze = alice.get(f"/v1/jobs/{job_id}").json()["progress"]["step"]
            assert at_freeze < STEPS - 50, "the job is nearly done: make it longer"
            job = wait_for(
                alice,
                job_id,
                lambda j: j["attempts"] == 2 and j["progress"]["step"] >= at_freeze + 5,
            )
            assert holder(svc, client, job_id) == second and len(job_processes(b)) == 1
            assert len(job_processes(a)) == 1  # frozen, not dead: it would train on if woken
            assert lease_owner(client, job_id) == claimed_by(client, job_id)

            thaw(*frozen)
            frozen = None
            wait_until("the first worker to kill its job", lambda: not job_processes(a), timeout=10)
            assert "leaving the job to its next holder" in svc.worker_log(first)
            assert len(job_processes(b)) == 1
            assert holder(svc, client, job_id) == second

            done = wait_status(alice, job_id, TERMINAL, timeout=180)
        finally:
            if frozen is not None:
                thaw(*frozen)
            if alice.get(f"/v1/jobs/{job_id}").json()["status"] not in TERMINAL:
                alice.post(f"/v1/jobs/{job_id}/cancel")
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 2
        assert done["progress"] == {"step": STEPS, "total": STEPS}
        events = read_events(alice, job_id)
        assert metric_steps(events) == list(range(1, STEPS + 1))
        history = alice.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
        assert [row["step"] for row in history] == list(range(1, STEPS + 1))
        statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
        assert statuses == ["queued", "running", "queued", "running", "succeeded"]
    client.close()
