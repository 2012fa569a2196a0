"""The reaper counts lost workers: a job whose worker died `PDPPO_MAX_WORKER_LOSSES` times is
queued again each time, and failed with `worker_lost` at the next loss.

The losses are worker deaths as the reaper sees them: a worker took the lease and claimed the
job (the same `Lease` and `JobStore.claim` a worker runs), then stopped renewing. Dying here is
the test letting its short lease expire, which takes a second instead of a worker start per loss
(`test_isolation.py` kills real workers twice). The reaper is the real one, in a real worker's
thread, on a job of the `gpu` queue, which this CPU worker never takes itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import redis

from pdppo.store import JobStore
from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import TERMINAL, read_events
from workers.job.lease import Lease

MAX_LOSSES = 2
GHOST_LEASE_SECONDS = 1.0


def die_holding(client: redis.Redis, job_id: str, loss: int) -> None:
    """Take the job as a worker does (lease, then claim) and die: the lease is never renewed."""
    lease = Lease(client, job_id, GHOST_LEASE_SECONDS, owner=f"ghost-{loss}")
    assert lease.acquire(), f"loss {loss}: the lease of {job_id} is held"
    assert JobStore(client).claim(job_id, f"ghost-{loss}"), f"loss {loss}: claim refused"


def wait_reaped(alice: httpx.Client, job_id: str, loss: int) -> dict[str, Any]:
    """The job once the reaper has dealt with its lost worker (queued again, or ended)."""
    deadline = time.monotonic() + 30
    while True:
        job: dict[str, Any] = alice.get(f"/v1/jobs/{job_id}").json()
        if job["status"] != "running":
            return job
        assert time.monotonic() < deadline, f"loss {loss}: the reaper never came: {job}"
        time.sleep(0.1)


def test_reaper_requeues_max_losses_then_fails_the_job(
    make_service: Callable[..., Service],
) -> None:
    """Protects `workers.upkeep.reaper.reap_once` passing PDPPO_MAX_WORKER_LOSSES on: ignored (or
    off by one either way), the job is requeued forever, or failed one loss early."""
    svc = make_service(PDPPO_MAX_WORKER_LOSSES=str(MAX_LOSSES))
    svc.start_api()
    svc.start_worker("cpu")  # its reaper and dispatcher run from now on
    client = redis.Redis.from_url(svc.redis_url, decode_responses=True)
    spec = smoke_spec()
    spec["resources"] = {"device": "gpu"}
    with svc.client("alice") as alice:
        job_id = alice.post("/v1/jobs", json=spec).json()["id"]
        try:
            for loss in range(1, MAX_LOSSES + 1):
                die_holding(client, job_id, loss)
                job = wait_reaped(alice, job_id, loss)
                assert job["status"] == "queued", (loss, job)
                assert job["attempts"] == loss and job["error"] is None
            die_holding(client, job_id, MAX_LOSSES + 1)
            job = wait_reaped(alice, job_id, MAX_LOSSES + 1)
        finally:
            if alice.get(f"/v1/jobs/{job_id}").json()["status"] not in TERMINAL:
                alice.post(f"/v1/jobs/{job_id}/cancel")
        assert job["status"] == "failed", job
        assert job["attempts"] == MAX_LOSSES + 1
        assert job["error"]["code"] == "worker_lost"
        assert job["error"]["message"] == (
            f"the job's worker died {MAX_LOSSES + 1} times while running it (killed, out of "
            "memory, or lost its machine); not retried again"
        )
        events = read_events(alice, job_id, timeout=30)
        statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
        assert statuses == ["queued", *["running", "queued"] * MAX_LOSSES, "running", "failed"]
        requeued = [e for e in events if e["event"] == "log"]
        assert [e["data"]["message"] for e in requeued] == MAX_LOSSES * [
            "worker lost; queued again to resume from its last checkpoint"
        ]
        assert events[-1]["event"] == "done" and events[-1]["data"] == {"status": "failed"}
    client.close()
