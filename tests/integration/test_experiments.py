"""Experiments on the real stack: a grid of smoke jobs over paired seeds, created all or nothing,
reported on from the children's own metrics, cancelled and deleted as one, kept apart per tenant,
and queued behind the tenant's other work."""

from __future__ import annotations

import time
from collections.abc import Callable
from statistics import fmean
from typing import Any

import httpx
import redis
from celery import Celery

from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import handled, wait_path, wait_status

LONG = {"steps": 5000, "checkpoint_every": 0}  # minutes of work; only a cancel ends it
MASKS = {"algorithm.mask": ["predictive", "dppo"]}
TERMINAL = {"succeeded", "failed", "cancelled"}


def experiment(base: dict[str, Any], grid: dict[str, list[Any]], seeds: int, **more: Any) -> Any:
    return {"base": base, "grid": grid, "seeds": seeds, **more}


def wait_experiment(
    client: httpx.Client,
    experiment_id: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 240,
) -> dict[str, Any]:
    return wait_path(client, f"/v1/experiments/{experiment_id}", predicate, timeout, 0.2)


def runs(exp: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [(arm["name"], run["seed"], run["job_id"]) for arm in exp["arms"] for run in arm["runs"]]


def job_ids(client: httpx.Client) -> set[str]:
    return {j["id"] for j in client.get("/v1/jobs", params={"limit": 100}).json()["items"]}


def final(client: httpx.Client, job_id: str, fraction: float) -> float:
    """The child's final reward from its own metrics: the mean over its last `fraction` of steps."""
    rows = client.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    last = rows[-max(1, int(len(rows) * fraction)) :]
    return fmean(row["metrics"]["reward_mean"] for row in last)


def masked(client: httpx.Client, job_id: str) -> float:
    rows = client.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    return fmean(row["metrics"]["masked_fraction"] for row in rows)


def test_paired_children_report_csv_curves_and_delete(alice: httpx.Client) -> None:
    # a warm-up on true answers: rewards above 0 from the first step, different per seed and lr
    base = smoke_spec()
    base["train"]["task"] |= {"warmup_steps": 20, "warmup_target": "answer"}
    body = experiment(base, {"optim.lr": [0.003, 0.03]}, 2, name="paired")
    created = alice.post("/v1/experiments", json=body)
    assert created.status_code == 201, created.text
    exp = created.json()
    assert [a["name"] for a in exp["arms"]] == ["lr=0.003", "lr=0.03"]
    assert exp["baseline"] == "lr=0.003"
    assert [[r["seed"] for r in a["runs"]] for a in exp["arms"]] == [[0, 1], [0, 1]]
    for arm, seed, job_id in runs(exp):
        child = alice.get(f"/v1/jobs/{job_id}").json()
        assert child["experiment"] == exp["id"]
        spec = child["spec"]
        assert spec["train"]["seed"] == seed
        assert spec["train"]["optim"]["lr"] == float(arm.removeprefix("lr="))
        assert spec["name"] == f"paired/{arm}/seed{seed}"

    done = wait_experiment(alice, exp["id"], lambda e: e["status"] in TERMINAL | {"partial"})
    assert done["status"] == "succeeded", done
    assert done["counts"] == {"succeeded": 4}

    # threshold -1: every seed's 5-step running mean reaches it at the first 5-step window
    params = {"final_fraction": 0.25, "threshold": -1}
    got = alice.get(f"/v1/experiments/{exp['id']}/report", params=params)
    assert got.status_code == 200, got.text
    rep = got.json()
    assert rep["metric"] == "reward_mean" and rep["baseline"] == "lr=0.003"
    assert rep["paired_seeds"] == [0, 1]
    arms = {a["name"]: a for a in rep["arms"]}
    assert list(arms) == ["lr=0.003", "lr=0.03"]
    assert arms["lr=0.003"]["vs_baseline"] is None
    ids = {(arm, seed): job_id for arm, seed, job_id in runs(exp)}
    diffs: list[float] = []
    for seed in (0, 1):
        mine = final(alice, ids[("lr=0.03", seed)], 0.25)
        base = final(alice, ids[("lr=0.003", seed)], 0.25)
        assert arms["lr=0.03"]["final"]["per_seed"][str(seed)] == mine
        diff = arms["lr=0.03"]["vs_baseline"]["per_seed"][str(seed)]
        assert abs(diff - (mine - base)) < 1e-12
        diffs.append(diff)
        for arm in ("lr=0.003", "lr=0.03"):
            got_masked = arms[arm]["masked_fraction"]["per_seed"][str(seed)]
            assert abs(got_masked - masked(alice, ids[(arm, seed)])) < 1e-12
    assert any(d != 0 for d in diffs), diffs  # the pairing is tested on runs that differ
    reached = arms["lr=0.03"]["steps_to_threshold"]
    assert reached == {"reached": 2, "of": 2, "median": 5, "per_seed": {"0": 5, "1": 5}}

    csv = alice.get(f"/v1/experiments/{exp['id']}/report", params={"format": "csv"})
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.strip().splitlines()
    assert "arm" in lines[0]
    assert any(line.startswith("lr=0.03,1,") for line in lines[1:]), lines
    other = alice.get(f"/v1/experiments/{exp['id']}/report", params={"baseline": "lr=0.03"})
    assert {a["name"]: a["vs_baseline"] for a in other.json()["arms"]}["lr=0.03"] is None
    unknown = alice.get(f"/v1/experiments/{exp['id']}/report", params={"metric": "nope"})
    assert unknown.status_code == 422 and "nope" in unknown.json()["detail"]

    curves = alice.get(f"/v1/experiments/{exp['id']}/curves").json()
    assert set(curves["arms"]) == {"lr=0.003", "lr=0.03"}
    assert curves["arms"]["lr=0.03"]["step"] == [1, 2, 3, 4, 5, 6, 7, 8]
    listed = alice.get("/v1/experiments").json()["items"]
    assert exp["id"] in [e["id"] for e in listed]

    assert alice.delete(f"/v1/experiments/{exp['id']}").status_code == 204
    assert alice.get(f"/v1/experiments/{exp['id']}").status_code == 404
    assert all(alice.get(f"/v1/jobs/{job_id}").status_code == 404 for *_, job_id in runs(exp))


def test_an_on_policy_experiment_says_why_its_arms_are_identical(alice: httpx.Client) -> None:
    """The smoke job is on-policy (no staleness, one minibatch, fp32 rollouts): no mask fires,
    so its predictive and DPPO arms are the same run seed for seed. The report gave a 0-0-2 sign
    test and `p=-` with no word of why; now it says."""
    body = experiment(smoke_spec(steps=3, checkpoint_every=0), MASKS, 2, name="on-policy")
    created = alice.post("/v1/experiments", json=body)
    assert created.status_code == 201, created.text
    exp = created.json()
    done = wait_experiment(alice, exp["id"], lambda e: e["status"] in TERMINAL | {"partial"})
    assert done["counts"] == {"succeeded": 4}, done
    rep = alice.get(f"/v1/experiments/{exp['id']}/report").json()
    arms = {a["name"]: a for a in rep["arms"]}
    assert rep["baseline"] == "mask=predictive" and rep["paired_seeds"] == [0, 1]
    assert arms["mask=predictive"]["masked_fraction"]["per_seed"] == {"0": 0.0, "1": 0.0}
    assert arms["mask=dppo"]["masked_fraction"]["per_seed"] == {"0": 0.0, "1": 0.0}
    versus = arms["mask=dppo"]["vs_baseline"]
    assert versus["per_seed"] == {"0": 0.0, "1": 0.0}
    assert versus["sign_test"] == {"wins": 0, "losses": 0, "ties": 2, "p_value": None}
    assert versus["note"] == (
        "identical to the baseline on every paired seed (2 of 2): no mask fired in either arm "
        "(masked fraction 0 on every seed), so the arms could not differ; on-policy rollouts "
        "leave a trust region nothing to correct (set rollout.staleness, algorithm.minibatches "
        "or rollout.dtype to compare masks)"
    )
    assert arms["mask=predictive"]["vs_baseline"] is None


def test_cancel_stops_every_child_and_delete_waits_for_it(alice: httpx.Client) -> None:
    exp = alice.post("/v1/experiments", json=experiment(smoke_spec(**LONG), MASKS, 2)).json()
    wait_experiment(alice, exp["id"], lambda e: e["status"] == "running", timeout=60)
    refused = alice.delete(f"/v1/experiments/{exp['id']}")
    assert refused.status_code == 409 and "cancel" in refused.json()["detail"]
    assert alice.get(f"/v1/experiments/{exp['id']}").status_code == 200

    cancelled = alice.post(f"/v1/experiments/{exp['id']}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    done = wait_experiment(alice, exp["id"], lambda e: e["status"] in TERMINAL, timeout=30)
    assert done["status"] == "cancelled" and done["counts"] == {"cancelled": 4}
    assert alice.delete(f"/v1/experiments/{exp['id']}").status_code == 204


def test_pause_and_resume_act_on_every_child(alice: httpx.Client) -> None:
    gpu = smoke_spec(**LONG) | {"resources": {"device": "gpu"}}  # no GPU worker: stays queued
    exp = alice.post("/v1/experiments", json=experiment(gpu, MASKS, 1)).json()
    paused = alice.post(f"/v1/experiments/{exp['id']}/pause").json()
    assert paused["status"] == "paused" and paused["counts"] == {"paused": 2}
    resumed = alice.post(f"/v1/experiments/{exp['id']}/resume").json()
    assert resumed["status"] == "queued" and resumed["counts"] == {"queued": 2}
    alice.post(f"/v1/experiments/{exp['id']}/cancel")
    assert alice.delete(f"/v1/experiments/{exp['id']}").status_code == 204


def test_tenants_isolated_and_a_retry_duplicates_nothing(
    service: Service, alice: httpx.Client, bob: httpx.Client
) -> None:
    gpu = smoke_spec(**LONG) | {"resources": {"device": "gpu"}}
    body = experiment(gpu, {"algorithm.mask": ["predictive"]}, 2, name="same")
    key = {"Idempotency-Key": "exp-isolation"}
    mine = alice.post("/v1/experiments", json=body, headers=key)
    theirs = bob.post("/v1/experiments", json=body, headers=key)
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]
    assert "Idempotent-Replayed" not in theirs.headers
    assert bob.get(f"/v1/experiments/{mine.json()['id']}").status_code == 404
    assert bob.post(f"/v1/experiments/{mine.json()['id']}/cancel").status_code == 404
    assert mine.json()["id"] not in [e["id"] for e in bob.get("/v1/experiments").json()["items"]]

    # the API died after creating the child of seed 1 and before recording it: a retry with the
    # same key records that same job, and makes no second one
    exp_id = mine.json()["id"]
    lost = runs(mine.json())[1][2]
    store = redis.Redis.from_url(service.redis_url, decode_responses=True)
    assert store.hdel(f"pdppo:tenant:alice:experiment:{exp_id}:runs", "0/1") == 1
    store.close()
    before = job_ids(alice)
    again = alice.post("/v1/experiments", json=body, headers=key)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == exp_id and runs(again.json())[1][2] == lost
    assert job_ids(alice) == before
    changed = alice.post("/v1/experiments", json=body | {"seeds": 3}, headers=key)
    assert changed.status_code == 409

    for client, exp in ((alice, mine.json()), (bob, theirs.json())):
        client.post(f"/v1/experiments/{exp['id']}/cancel")
        assert client.delete(f"/v1/experiments/{exp['id']}").status_code == 204


def test_a_bad_arm_or_grid_path_creates_no_job(alice: httpx.Client) -> None:
    before = job_ids(alice)
    listed = {e["id"] for e in alice.get("/v1/experiments", params={"limit": 100}).json()["items"]}
    path = alice.post(
        "/v1/experiments", json=experiment(smoke_spec(), {"algorithm.maks": ["dppo"]}, 2)
    )
    assert path.status_code == 422 and "maks" in path.json()["detail"], path.text
    # the first arm is valid, the second is not: the first must not have been created either
    bad = experiment(smoke_spec(), {"algorithm.mask": ["predictive", "sometimes"]}, 2)
    arm = alice.post("/v1/experiments", json=bad)
    assert arm.status_code == 422, arm.text
    assert "arm 'mask=sometimes', seed 0" in arm.json()["detail"]
    assert job_ids(alice) == before
    after = {e["id"] for e in alice.get("/v1/experiments", params={"limit": 100}).json()["items"]}
    assert after == listed


def test_a_job_submitted_after_an_experiment_does_not_wait_for_all_of_it(
    make_service: Callable[..., Service],
) -> None:
    """One worker of concurrency 1; a 6-child experiment, then a job: the job starts right after
    the child that was running when it came, not after the experiment's last child."""
    svc = make_service(PDPPO_MAX_ACTIVE_JOBS_PER_TENANT="8")
    svc.start_api()
    with svc.client("alice") as alice:
        body = experiment(smoke_spec(steps=3), {"algorithm.mask": ["predictive", "dppo"]}, 3)
        exp = alice.post("/v1/experiments", json=body).json()
        job = alice.post("/v1/jobs", json=smoke_spec(steps=3)).json()
        svc.start_worker("cpu")  # every task is in the queue before the worker takes the first
        wait_status(alice, job["id"], "succeeded", timeout=240)
        done = wait_experiment(alice, exp["id"], lambda e: e["status"] in TERMINAL, timeout=300)
        assert done["status"] == "succeeded", done
        started = {
            job_id: alice.get(f"/v1/jobs/{job_id}").json()["started_at"]
            for *_, job_id in runs(done)
        }
        mine = alice.get(f"/v1/jobs/{job['id']}").json()["started_at"]
        order = sorted([*started, job["id"]], key=lambda i: started.get(i) or mine)
        assert order[0] == job["id"], order  # waiting together, the job goes first
        seeds = {job_id: seed for _, seed, job_id in runs(done)}
        assert [seeds[i] for i in order[1:]] == [0, 0, 1, 1, 2, 2]  # seed-major


def test_an_experiment_past_the_active_job_limit_creates_nothing(alice: httpx.Client) -> None:
    """The session service allows 4 active jobs a tenant: 6 children are refused whole."""
    before = job_ids(alice)
    listed = {e["id"] for e in alice.get("/v1/experiments", params={"limit": 100}).json()["items"]}
    refused = alice.post("/v1/experiments", json=experiment(smoke_spec(), MASKS, 3))
    assert refused.status_code == 429, refused.text
    assert "needs 6 jobs" in refused.json()["detail"] and refused.headers["Retry-After"] == "30"
    assert job_ids(alice) == before
    after = {e["id"] for e in alice.get("/v1/experiments", params={"limit": 100}).json()["items"]}
    assert after == listed


def test_cancelling_revokes_the_tasks_of_queued_children(
    make_service: Callable[..., Service],
) -> None:
    """The children a cancel finds queued have their tasks revoked, as `POST /v1/jobs/{id}/cancel`
    revokes a queued job's: the worker discards them unstarted ('Discarding revoked task'). Without
    the revoke the worker takes each task and the task skips its cancelled job ('job <id>:
    skipped: already cancelled').

    The worker must hold the revoke before the tasks reach it, and a worker busy with a job reads
    neither until it is free (its pool is solo), then in either order: so the children wait in the
    gpu queue, which the only worker (cpu) does not consume, and it is told to consume it after
    the cancel. Its control messages arrive in the order they were sent, revoke first."""
    svc = make_service()
    svc.start_api()
    svc.start_worker("cpu")
    gpu = smoke_spec() | {"resources": {"device": "gpu"}}
    with svc.client("alice") as alice:
        exp = alice.post("/v1/experiments", json=experiment(gpu, MASKS, 1)).json()
        children = [job_id for *_, job_id in runs(exp)]
        cancelled = alice.post(f"/v1/experiments/{exp['id']}/cancel")
        assert cancelled.status_code == 202, cancelled.text
        assert cancelled.json()["counts"] == {"cancelled": 2}

        control = Celery("probe", broker=svc.redis_url)
        try:
            replies = control.control.add_consumer("gpu", reply=True, timeout=10)
        finally:
            control.close()
        assert len(replies) == 1, replies
        deadline = time.monotonic() + 30
        while not all(handled(svc.worker_log(), c) for c in children):
            assert time.monotonic() < deadline, svc.worker_log()[-3000:]
            time.sleep(0.1)
        log = svc.worker_log()
        for child in children:
            assert f"revoked task: pdppo.train[{child}]" in log, log[-3000:]
            assert f"job {child}: " not in log, log[-3000:]
            after = alice.get(f"/v1/jobs/{child}").json()
            assert (after["status"], after["started_at"], after["attempts"]) == (
                "cancelled",
                None,
                0,
            )


def test_children_that_ended_differently_make_the_experiment_partial(alice: httpx.Client) -> None:
    """One child cancelled on its own while the other runs to the end: the experiment is neither
    succeeded nor cancelled but partial, and says how many ended each way."""
    body = experiment(smoke_spec(steps=3), {"algorithm.mask": ["predictive"]}, 2)
    exp = alice.post("/v1/experiments", json=body).json()
    (_, _, first), (_, _, second) = runs(exp)
    # seed 1 waits behind seed 0 for the only worker: cancelled before it starts
    assert alice.post(f"/v1/jobs/{second}/cancel").status_code == 202

    done = wait_experiment(alice, exp["id"], lambda e: e["status"] in TERMINAL | {"partial"})
    assert done["status"] == "partial", done
    assert done["counts"] == {"succeeded": 1, "cancelled": 1}
    statuses = {run["job_id"]: run["status"] for run in done["arms"][0]["runs"]}
    assert statuses == {first: "succeeded", second: "cancelled"}
    listed = alice.get("/v1/experiments").json()["items"]
    assert [e["status"] for e in listed if e["id"] == exp["id"]] == ["partial"]
    # the report pairs the seeds that have metrics: the cancelled one has none
    report = alice.get(f"/v1/experiments/{exp['id']}/report").json()
    assert report["paired_seeds"] == [0]
    assert [(a["name"], a["seeds"]) for a in report["arms"]] == [("mask=predictive", [0])]
    assert alice.delete(f"/v1/experiments/{exp['id']}").status_code == 204
