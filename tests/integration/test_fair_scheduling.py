"""Fair scheduling on the real stack (issue 49, point 8): one CPU worker, a backlog of bob's plain
jobs, then alice's experiment. Its children start within a job of their submission, taking turns
with bob's, instead of waiting behind all of them. Before, the worker started tasks in their
Celery queue's order, every plain job before any experiment's child (their lower priority): the
children started 6th and 7th of 7, and a steady stream of bob's jobs would have held them back for
ever. (bench/fairness.py measures the waits and shares of such a run.)"""

from __future__ import annotations

from collections.abc import Callable

from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import TERMINAL, wait_path, wait_status

SHORT = {"steps": 2, "checkpoint_every": 0}


def test_an_experiment_does_not_wait_behind_another_tenants_backlog(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service(PDPPO_MAX_ACTIVE_JOBS_PER_TENANT="8")
    svc.start_api()
    with svc.client("alice") as alice, svc.client("bob") as bob:
        backlog = [bob.post("/v1/jobs", json=smoke_spec(**SHORT)).json()["id"] for _ in range(5)]
        body = {"base": smoke_spec(**SHORT), "grid": {"algorithm.mask": ["predictive", "dppo"]}}
        made = alice.post("/v1/experiments", json={**body, "seeds": 1})
        assert made.status_code == 201, made.text
        children = [run["job_id"] for arm in made.json()["arms"] for run in arm["runs"]]
        svc.start_worker("cpu")  # every task waits in the queue before the worker takes one
        for job_id in backlog:
            assert wait_status(bob, job_id, TERMINAL, timeout=300)["status"] == "succeeded"
        path = f"/v1/experiments/{made.json()['id']}"
        done = wait_path(alice, path, lambda e: e["status"] in TERMINAL, 300, 0.2)
        assert done["status"] == "succeeded", done
        started = {
            job_id: client.get(f"/v1/jobs/{job_id}").json()["started_at"]
            for client, ids in ((bob, backlog), (alice, children))
            for job_id in ids
        }
    order = sorted(started, key=lambda job_id: started[job_id])
    owners = ["alice" if job_id in children else "bob" for job_id in order]
    # bob came first; then the two tenants take turns until alice has nothing left
    assert owners == ["bob", "alice", "bob", "alice", "bob", "bob", "bob"], owners
    assert [job_id for job_id in order if job_id in backlog] == backlog  # bob's in his order
    assert [job_id for job_id in order if job_id in children] == children  # seed-major
