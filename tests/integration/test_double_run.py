"""A job runs in one place at a time, however often its task is delivered (README: "a redelivered
task never runs a job twice").

Celery delivers at least once, so a job's task can reach a second worker while the first still
trains it: a duplicate publish (a sender that retried), or a redelivery after the first worker
seemed dead. Two real workers, one job:

1. its task is published again while the first worker trains it: the second worker finds the
   lease held and skips the task (no claim, no job process of its own);
2. the first worker is frozen (SIGSTOP of its process group) until its lease expires: a reaper
   queues the job again and the second worker resumes it. Its job process, in a session of its
   own, is not frozen with it (a worker paused alone, as by a GC or swap stall): it must notice
   on its own that the lease lapsed and stop within a step or two, its writes refused from the
   moment the lease expired (issue 12: fencing). With the whole machine frozen (the job process
   too), the job process stops as soon as it wakes, and its worker leaves the job.

Throughout, only the lease's holder writes: no event of the first claim is accepted after its
lease expired, the checkpoints folder gets no checkpoint from it after then (checkpoints every
step, so a stale process would write one at once), the second worker resumes from a checkpoint
written by the holder, and the job succeeds with every step published once, in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery
from kombu import Queue

from pdppo.store import events_key, job_key, lease_key
from tests.support.specs import smoke_spec
from tests.support.stack import Service, children, running
from tests.support.waits import TERMINAL, every_step_once, wait_for, wait_status
from workers.celery_app import TRAIN_TASK

STEPS = 150
CHECKPOINT_EVERY = 1  # a stale process that went on would write a checkpoint at its next step
CLOCK_SLACK = 0.02  # seconds between a PTTL read and the clock it is compared with


def publish_again(redis_url: str, job_id: str) -> None:
    """The job's task, sent once more exactly as `workers.celery_app.enqueue` sends it."""
    app = Celery("duplicate", broker=redis_url)
    app.conf.update(task_queues=[Queue("cpu")], task_serializer="json")
    try:
        app.send_task(TRAIN_TASK, args=[job_id], queue="cpu", task_id=job_id)
    finally:
        app.close()


def job_processes(worker: subprocess.Popen[bytes]) -> list[int]:
    """The worker's job processes: children of its fork server (`workers.job.process`)."""
    found = []
    for child in children(worker.pid):
        try:
            cmdline = (Path("/proc") / str(child) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"forkserver" in cmdline:
            found += [pid for pid in children(child) if running(pid)]
    return found


def claimed_by(client: redis.Redis, job_id: str) -> str:
    """The worker that claimed the job last, as `host:pid` (the record's `worker` field)."""
    return str(client.hget(job_key(job_id), "worker"))


def freeze(worker: subprocess.Popen[bytes], *, whole_machine: bool) -> list[int]:
    """SIGSTOP the worker's process group (its fork server with it), and with `whole_machine`
    its job processes too, as when its machine pauses (a job process is in a session of its
    own, so a signal to the worker's group misses it); returns the job processes frozen."""
    jobs = job_processes(worker) if whole_machine else []
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


class FolderSpy(threading.Thread):
    """Every version of every checkpoint the job folder holds, looked at every 20 ms (a
    checkpoint lives for keep_checkpoints steps): step -> the `saved_at` of each version seen.
    Also when the first worker's job process was last seen alive (`a_alive_at`)."""

    def __init__(self, folder: Path, worker: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True)
        self.folder = folder / "checkpoints"
        self.worker = worker
        self.seen: dict[int, set[float]] = defaultdict(set)
        self.a_alive_at = time.time()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.look()

    def look(self) -> None:
        if job_processes(self.worker):
            self.a_alive_at = time.time()
        for meta in self.folder.glob("step-*/meta.json"):
            if not re.fullmatch(r"step-\d+", meta.parent.name):
                continue  # a checkpoint being written
            try:
                data = json.loads(meta.read_text())
            except (OSError, ValueError):
                continue  # rotated away or renamed meanwhile
            self.seen[int(data["step"])].add(float(data["saved_at"]))


def stream(client: redis.Redis, job_id: str) -> list[tuple[float, str, dict[str, Any]]]:
    """(Redis's time of the entry in seconds, type, data) of each event, in order."""
    entries = cast(list[tuple[str, dict[str, str]]], client.xrange(events_key(job_id)))
    return [
        (int(eid.split("-")[0]) / 1000, fields["type"], json.loads(fields["data"]))
        for eid, fields in entries
    ]


def lease_expiry(client: redis.Redis, job_id: str) -> float:
    """When the job's lease expires (wall clock), its holder frozen: it is renewed no more."""
    before = time.time()
    ttl_ms = int(client.pttl(lease_key(job_id)))
    assert ttl_ms > 0, f"the lease of {job_id} already expired ({ttl_ms})"
    return before + ttl_ms / 1000


@pytest.mark.parametrize("whole_machine", [False, True], ids=["worker-frozen", "machine-frozen"])
def test_a_redelivered_task_never_runs_a_job_twice_at_once(
    make_service: Callable[..., Service], whole_machine: bool
) -> None:
    """Protects the lease in `workers.job.runner` (`run_job` skipping a task whose lease is held,
    `_supervise` killing the job on a lost lease) and the fence of issue 12: the store's scripts
    refusing a stale lease token (`pdppo.store.jobs.worker_side`), and the job process's own watch
    of its lease and the gate before each checkpoint (`workers.job.lease.LeaseFence`)."""
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
        spy: FolderSpy | None = None
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
            spy = FolderSpy(svc.artifact_dir / job_id, a)
            spy.start()
            frozen = (a, freeze(a, whole_machine=whole_machine))
            time.sleep(0.5)  # a renewal in flight when it froze has landed
            expires = lease_expiry(client, job_id)
            at_freeze = alice.get(f"/v1/jobs/{job_id}").json()["progress"]["step"]
            assert at_freeze < STEPS - 50, "the job is nearly done: make it longer"
            if not whole_machine:
                # Its job process trains on alone until it sees the lease lapse.
                wait_until("the first job process to stop", lambda: not job_processes(a), 10)
                stopped_after = spy.a_alive_at - expires
                print(f"first job process stopped {stopped_after:+.2f}s after its lease expired")
                assert stopped_after < 2.0, "the stale job process trained on"
                log_a = svc.worker_log(first)
                assert "stopped without a checkpoint, leaving the job to its next holder" in log_a
                # It published steps until its lease lapsed: the second worker's progress is
                # counted from where the first one's stopped, or a job process that has not
                # started yet would pass for one that trains.
                at_freeze = alice.get(f"/v1/jobs/{job_id}").json()["progress"]["step"]
            job = wait_for(
                alice,
                job_id,
                lambda j: j["attempts"] == 2 and j["progress"]["step"] >= at_freeze + 5,
            )
            assert holder(svc, client, job_id) == second and len(job_processes(b)) == 1
            if whole_machine:
                assert len(job_processes(a)) == 1  # frozen, not dead: it would train on if woken
            else:
                assert job_processes(a) == []
            assert lease_owner(client, job_id) == claimed_by(client, job_id)

            thaw(*frozen)
            frozen = None
            wait_until("the first worker to kill its job", lambda: not job_processes(a), timeout=10)
            wait_until(
                "the first worker to leave the job",
                lambda: "leaving the job to its next holder" in svc.worker_log(first),
                timeout=10,
            )
            assert len(job_processes(b)) == 1
            assert holder(svc, client, job_id) == second

            done = wait_status(alice, job_id, TERMINAL, timeout=180)
        finally:
            if frozen is not None:
                thaw(*frozen)
            if spy is not None:
                spy.done.set()
            if alice.get(f"/v1/jobs/{job_id}").json()["status"] not in TERMINAL:
                alice.post(f"/v1/jobs/{job_id}/cancel")
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 2
        assert done["progress"] == {"step": STEPS, "total": STEPS}
        events = every_step_once(alice, job_id, STEPS)
        statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
        assert statuses == ["queued", "running", "queued", "running", "succeeded"]

    # Nothing of the first claim was accepted once its lease had expired: until the second
    # claim, only the reaper wrote (its log line and the `queued` status).
    entries = stream(client, job_id)
    claims = [at for at, kind, data in entries if kind == "status" and data["status"] == "running"]
    second_claim = claims[1]
    late = [
        (kind, data.get("step"), round(at - expires, 3))
        for at, kind, data in entries
        if expires + CLOCK_SLACK < at < second_claim and kind != "status"
    ]
    assert len(late) <= 1 and all(kind == "log" for kind, _, _ in late), late

    # The checkpoints folder was written by the lease's holder only: the second worker resumed
    # from a checkpoint saved before the first one's lease expired; every later one it wrote
    # itself, once, after its claim.
    resumed = [
        int(m.group(1))
        for _, kind, data in entries
        if kind == "log" and (m := re.search(r"^resumed from .* at step (\d+)$", data["message"]))
    ]
    assert len(resumed) == 1, resumed
    upto = resumed[0]
    assert upto >= at_freeze - 1
    stale = {s: sorted(t - expires for t in v) for s, v in spy.seen.items() if s <= upto}
    assert all(t <= CLOCK_SLACK for times in stale.values() for t in times), stale
    assert upto in spy.seen
    later = {s: sorted(t - second_claim for t in v) for s, v in spy.seen.items() if s > upto}
    assert all(len(times) == 1 and times[0] >= 0 for times in later.values()), later
    client.close()
