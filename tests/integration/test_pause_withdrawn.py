"""A pause withdrawn by a resume: the job's log says what happens next, on each branch.

Before the worker carries the pause out, the job runs on. Once it has begun stopping the job
for it (`JobStore.begin_pause`), the job stops anyway, checkpoints and is queued again to run on.
The second branch logged "pause withdrawn before the job stopped; it runs on" too, followed by
the worker's "the pause was withdrawn while the job stopped; queued again to run on".
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.specs import smoke_spec
from tests.support.stack import RedisServer, Service, job_pids
from tests.support.waits import read_events, wait_for, wait_status

LONG = {"steps": 5000, "checkpoint_every": 0}  # minutes of work; only a cancel ends it
TERMINAL = {"succeeded", "failed", "cancelled"}
RUNS_ON = "pause withdrawn before the job stopped; it runs on"
STOPS_ANYWAY = (
    "pause withdrawn after the job had begun stopping for it: it stops at its checkpoint as "
    "planned, then is queued again to run on from there"
)
REQUEUED = "the pause was withdrawn while the job stopped; queued again to run on"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A service whose worker may be frozen for a moment without losing its lease (30 s)."""
    redis = RedisServer(tmp_path_factory.mktemp("withdrawn-redis"))
    root = tmp_path_factory.mktemp("withdrawn")
    service = Service(redis, root, env={"PDPPO_LEASE_SECONDS": "30"})
    try:
        service.start_api()
        service.start_worker("cpu")
        yield service
    finally:
        service.stop()
        redis.stop()


def logs(client: httpx.Client, job_id: str) -> list[str]:
    return [e["data"]["message"] for e in read_events(client, job_id) if e["event"] == "log"]


def wait_logged(svc: Service, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in svc.worker_log():
        assert time.monotonic() < deadline, svc.worker_log()[-3000:]
        time.sleep(0.05)


def frozen(pid: int, action: Callable[[], None]) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        action()
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_pause_withdrawn_before_the_worker_acts_on_it_lets_the_job_run_on(
    svc: Service,
) -> None:
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)

        def pause_and_resume() -> None:  # the worker, frozen, reads no flag in between
            assert alice.post(f"/v1/jobs/{job['id']}/pause").status_code == 202
            assert alice.post(f"/v1/jobs/{job['id']}/resume").status_code == 202

        frozen(svc.workers[0].pid, pause_and_resume)
        at = alice.get(f"/v1/jobs/{job['id']}").json()["progress"]["step"]
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= at + 3)
        alice.post(f"/v1/jobs/{job['id']}/cancel")
        done = wait_status(alice, job["id"], TERMINAL, timeout=30)
        said = logs(alice, job["id"])
    assert (done["status"], done["attempts"]) == ("cancelled", 1), done
    assert RUNS_ON in said, said
    assert STOPS_ANYWAY not in said and REQUEUED not in said, said
    assert f"job {job['id']}: asking it to stop (pause)" not in svc.worker_log()


def test_a_pause_withdrawn_while_the_job_stops_for_it_says_it_is_queued_again(
    svc: Service,
) -> None:
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)
        (pid,) = job_pids(svc, job["id"])

        def pause_then_resume() -> None:  # the job, frozen, cannot stop before the resume
            assert alice.post(f"/v1/jobs/{job['id']}/pause").status_code == 202
            wait_logged(svc, f"job {job['id']}: asking it to stop (pause)")
            assert alice.post(f"/v1/jobs/{job['id']}/resume").status_code == 202

        frozen(pid, pause_then_resume)
        wait_for(alice, job["id"], lambda j: j["attempts"] == 2 and j["status"] == "running")
        alice.post(f"/v1/jobs/{job['id']}/cancel")
        done = wait_status(alice, job["id"], TERMINAL, timeout=30)
        said = logs(alice, job["id"])
    assert done["status"] == "cancelled", done
    assert RUNS_ON not in said, said
    assert said.index(STOPS_ANYWAY) < said.index(REQUEUED), said
