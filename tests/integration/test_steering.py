"""Steering through the service: `PATCH /v1/jobs/{id}` changes a running job's settings at its
next step, pause checkpoints and frees the worker, resume continues with no step lost or
repeated, and a job resumed after a worker kill keeps its changed settings."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx

from core.config import LR_FROM_SCRATCH
from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import metric_steps, read_events, wait_for, wait_status

LONG = {"steps": 5000, "checkpoint_every": 0}  # minutes of work; only a cancel ends it
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
TERMINAL = {"succeeded", "failed", "cancelled"}


def patch(client: httpx.Client, job_id: str, change: dict[str, Any]) -> httpx.Response:
    return client.patch(f"/v1/jobs/{job_id}", json=change, headers=MERGE_PATCH)


def lr_by_step(client: httpx.Client, job_id: str) -> dict[int, float]:
    rows = client.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    return {row["step"]: row["metrics"]["lr"] for row in rows}


def test_a_changed_learning_rate_shows_in_the_next_steps_metrics(alice: httpx.Client) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    start_lr = job["spec"]["train"]["optim"]["lr"]
    wait_for(alice, job["id"], lambda j: j["status"] == "running" and j["progress"]["step"] >= 2)

    changed = patch(alice, job["id"], {"train": {"optim": {"lr": 1e-4}, "steps": 4000}})
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert body["config_version"] == 1
    assert body["overrides"] == {"train": {"optim": {"lr": 1e-4}, "steps": 4000}}
    assert body["spec"]["train"]["optim"]["lr"] == 1e-4  # the spec it runs with now
    assert body["progress"]["total"] == 4000
    at = body["progress"]["step"]
    # the job reads its changes every 0.5 s and applies one at its next step boundary
    wait_for(alice, job["id"], lambda j: j["metrics"]["lr"] == 1e-4, timeout=5)
    now = alice.get(f"/v1/jobs/{job['id']}").json()["progress"]["step"]
    wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= now + 2)
    alice.post(f"/v1/jobs/{job['id']}/cancel")
    wait_status(alice, job["id"], TERMINAL, timeout=15)

    events = read_events(alice, job["id"])
    configs = [e["data"] for e in events if e["event"] == "config"]
    assert len(configs) == 1, configs
    assert configs[0]["version"] == 1
    assert configs[0]["changes"] == {"optim.lr": 1e-4, "steps": 4000}
    applied = configs[0]["step"]  # the step after which it applies
    assert at <= applied < now
    lrs = lr_by_step(alice, job["id"])
    assert {s: lr for s, lr in lrs.items() if s <= applied} == dict.fromkeys(
        range(1, applied + 1), start_lr
    )
    later = {s: lr for s, lr in lrs.items() if s > applied}
    assert len(later) >= 2 and set(later.values()) == {1e-4}
    # the metrics event stream carries it too, step by step
    steps = [e["data"] for e in events if e["event"] == "metrics"]
    assert {data["step"]: data["metrics"]["lr"] for data in steps} == lrs
    totals = {data["step"]: data["total"] for data in steps}  # the run's length, as changed
    assert {totals[s] for s in later} == {4000} and totals[1] == 5000
    log = [e["data"]["message"] for e in events if e["event"] == "log"]
    asked = "config change 1 requested (train.optim.lr=0.0001, train.steps=4000)"
    assert any(asked in m for m in log), log

    finished = patch(alice, job["id"], {"train": {"optim": {"lr": 1e-5}}})
    assert finished.status_code == 409 and "cancelled" in finished.json()["detail"]


def test_changes_that_may_not_be_made_are_refused_naming_the_field(alice: httpx.Client) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    try:
        cases = [
            ({"train": {"rollout": {"group_size": 8}}}, "train.rollout.group_size"),
            ({"train": {"optim": {"lr": None}}}, "train.optim.lr"),
            ({"train": {"rollout": {"temperature": -1.0}}}, "train.rollout.temperature"),
            ({"train": {"algorithm": {"mask": "nope"}}}, "train.algorithm.mask"),
            ({"train": {"algorithm": {"kl_beta": 0.1}}}, "train.algorithm.kl_beta"),
            ({"resources": {"device": "gpu"}}, "resources"),
            ({"train": {"steps": "10"}}, "train.steps"),  # strict: no coercion
        ]
        for change, field in cases:
            refused = patch(alice, job["id"], change)
            assert refused.status_code == 422, (change, refused.text)
            named = [".".join(map(str, e["loc"][1:])) for e in refused.json()["errors"]]
            assert field in named, refused.json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 3)
        at = alice.get(f"/v1/jobs/{job['id']}").json()["progress"]["step"]
        short = patch(alice, job["id"], {"train": {"steps": 1}})
        assert short.status_code == 422, short.text
        said = short.json()["errors"][0]["msg"]  # the job moves on meanwhile: at least `at`
        found = re.match(r"the job is already at step (\d+); give at least that many", said)
        assert found and int(found[1]) >= at, said
        unchanged = alice.get(f"/v1/jobs/{job['id']}").json()
        assert unchanged["config_version"] == 0 and unchanged["overrides"] == {}
        other = patch(httpx.Client(base_url=str(alice.base_url)), job["id"], {})
        assert other.status_code == 401
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")
        wait_status(alice, job["id"], TERMINAL, timeout=15)


def test_pause_frees_the_worker_and_resume_continues_at_the_next_step(
    alice: httpx.Client,
) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    wait_for(alice, job["id"], lambda j: j["status"] == "running" and j["progress"]["step"] >= 3)

    asked = alice.post(f"/v1/jobs/{job['id']}/pause")
    assert asked.status_code == 202, asked.text
    assert asked.json()["pause_requested"] is True
    paused = wait_status(alice, job["id"], {"paused", *TERMINAL}, timeout=15)
    assert paused["status"] == "paused" and not paused["pause_requested"], paused
    k = paused["progress"]["step"]
    checkpoints = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    assert [c["step"] for c in checkpoints] == [k]
    again = alice.post(f"/v1/jobs/{job['id']}/pause")
    assert again.status_code == 202 and again.json()["status"] == "paused"
    listed = alice.get("/v1/jobs", params={"status": "paused"}).json()["items"]
    assert job["id"] in [j["id"] for j in listed]

    # the only worker is free: another job runs to the end while this one is paused
    other = alice.post("/v1/jobs", json=smoke_spec()).json()
    assert wait_status(alice, other["id"], TERMINAL)["status"] == "succeeded"
    assert alice.get(f"/v1/jobs/{job['id']}").json()["progress"]["step"] == k

    # a change made while paused applies when it resumes: it ends 4 steps after the pause
    assert patch(alice, job["id"], {"train": {"steps": k + 4}}).status_code == 200
    resumed = alice.post(f"/v1/jobs/{job['id']}/resume")
    assert resumed.status_code == 202 and resumed.json()["status"] == "queued", resumed.text
    done = wait_status(alice, job["id"], TERMINAL)
    assert done["status"] == "succeeded", done
    assert done["progress"] == {"step": k + 4, "total": k + 4}
    events = read_events(alice, job["id"])
    assert metric_steps(events) == list(range(1, k + 5))
    statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
    assert statuses == ["queued", "running", "paused", "queued", "running", "succeeded"]
    configs = [e["data"] for e in events if e["event"] == "config"]
    assert configs == [{"step": k, "version": 1, "changes": {"steps": k + 4}}]
    logs = [e["data"]["message"] for e in events if e["event"] == "log"]
    assert any(m.startswith("resumed from") and m.endswith(f"at step {k}") for m in logs), logs
    not_paused = alice.post(f"/v1/jobs/{job['id']}/resume")
    assert not_paused.status_code == 409


def test_a_paused_job_can_be_cancelled_and_a_queued_one_is_paused_on_the_spot(
    alice: httpx.Client,
) -> None:
    blocker = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    wait_status(alice, blocker["id"], "running")
    queued = alice.post("/v1/jobs", json=smoke_spec()).json()
    paused = alice.post(f"/v1/jobs/{queued['id']}/pause")
    assert paused.status_code == 202 and paused.json()["status"] == "paused", paused.text
    alice.post(f"/v1/jobs/{blocker['id']}/cancel")
    wait_status(alice, blocker["id"], TERMINAL, timeout=15)
    cancelled = alice.post(f"/v1/jobs/{queued['id']}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
    after = alice.get(f"/v1/jobs/{queued['id']}").json()
    assert after["attempts"] == 0 and after["started_at"] is None
    statuses = [
        e["data"]["status"] for e in read_events(alice, queued["id"]) if e["event"] == "status"
    ]
    assert statuses == ["queued", "paused", "cancelled"]


def test_a_job_resumed_after_a_worker_kill_keeps_its_changed_settings(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service()
    svc.start_api()
    first = svc.start_worker()
    with svc.client("alice") as alice:
        spec = smoke_spec(steps=5000, checkpoint_every=5, keep_checkpoints=20)
        spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)  # slower steps
        job = alice.post("/v1/jobs", json=spec).json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)
        body = patch(alice, job["id"], {"train": {"optim": {"lr": 2e-4}}}).json()
        assert body["config_version"] == 1
        applied = wait_for(alice, job["id"], lambda j: j["metrics"]["lr"] == 2e-4, timeout=5)
        # past the next checkpoint (every 5) after the change: the resume starts from one with it
        at = applied["progress"]["step"]
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= at + 6)
        svc.kill_worker(first)
        killed_at = alice.get(f"/v1/jobs/{job['id']}").json()["progress"]["step"]
        end = killed_at + 6
        assert patch(alice, job["id"], {"train": {"steps": end}}).status_code == 200
        svc.start_worker()
        done = wait_status(alice, job["id"], TERMINAL, timeout=120)
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 2 and done["progress"]["step"] == end

        events = read_events(alice, job["id"])
        assert metric_steps(events) == list(range(1, end + 1))
        configs = [e["data"] for e in events if e["event"] == "config"]
        assert [c["version"] for c in configs] == [1, 2], configs
        applied = configs[0]["step"]
        lrs = lr_by_step(alice, job["id"])
        assert {lrs[s] for s in range(applied + 1, end + 1)} == {2e-4}, lrs
        assert {lrs[s] for s in range(1, applied + 1)} == {LR_FROM_SCRATCH}  # smoke.yaml: unset
        logs = [e["data"]["message"] for e in events if e["event"] == "log"]
        assert any(m.startswith("resumed from") for m in logs), logs
