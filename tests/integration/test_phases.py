"""A job's phase (`loading model`, `warm-up k/N`, `training`, `evaluating`, `saving`) in its record
and event stream, and the warnings of a job that learned nothing: the store's script as a table
of states x writers, then a real job through the API, a worker and Redis."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import redis

from api.jobs.convert import to_job
from pdppo.store import JobStore, now_iso
from pdppo.store.jobs.worker_side import FencedOut
from pdppo.store.keys import events_key, job_key, lease_key
from tests.support.files import upload
from tests.support.specs import jsonl_spec
from tests.support.stack import Service
from tests.support.waits import read_events

STATUSES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")


def seed(client: redis.Redis, status: str, job_id: str = "j1", **fields: str) -> JobStore:
    now = now_iso()
    client.hset(
        job_key(job_id),
        mapping={
            "id": job_id,
            "tenant": "t",
            "status": status,
            "queue": "cpu",
            "spec": "{}",
            "created_at": now,
            "total_steps": "10",
            **fields,
        },
    )
    client.set(lease_key(job_id), "holder")
    return JobStore(client)


def phase_events(client: redis.Redis, job_id: str = "j1") -> list[dict[str, Any]]:
    entries = client.xrange(events_key(job_id))
    return [json.loads(f["data"]) for _, f in entries if f["type"] == "phase"]


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("token", ["", "holder", "stale"])
def test_a_phase_is_published_only_for_a_running_job_by_its_lease_holder(
    store_redis: redis.Redis, status: str, token: str
) -> None:
    store = seed(store_redis, status)
    before = store_redis.hget(job_key("j1"), "phase")
    if token == "stale":
        with pytest.raises(FencedOut):
            store.publish_phase("j1", "warm-up", 3, 65, at="t0", lease_token=token)
        published = False
    else:
        published = store.publish_phase("j1", "warm-up", 3, 65, at="t0", lease_token=token)
        assert published == (status == "running")
    record = store.get("j1")
    assert record is not None
    if published:
        assert record.phase == {"name": "warm-up", "done": 3, "total": 65}
        assert phase_events(store_redis) == [
            {"name": "warm-up", "done": 3, "total": 65, "at": "t0"}
        ]
    else:
        assert before is None and record.phase is None and phase_events(store_redis) == []


@pytest.mark.parametrize("status", STATUSES)
def test_a_claim_starts_the_phase_at_loading_the_model(
    store_redis: redis.Redis, status: str
) -> None:
    """Not the last run's phase; a job process takes seconds to start before it says its own."""
    phase = {"name": "training", "done": None, "total": None}
    store = seed(store_redis, status, phase=json.dumps(phase))
    claimed = store.claim("j1", "w2")
    assert claimed == (status in ("queued", "running"))
    record = store.get("j1")
    assert record is not None
    loading = {"name": "loading model", "done": None, "total": None}
    assert record.phase == (loading if claimed else phase)


@pytest.mark.parametrize("status", STATUSES)
def test_the_api_shows_a_phase_only_while_running_with_trainings_progress_from_the_step(
    store_redis: redis.Redis, status: str
) -> None:
    phases = {
        "warm-up": {"name": "warm-up", "done": 12, "total": 65},
        "training": {"name": "training", "done": 0, "total": 10},  # as entered, at step 0
    }
    for name, phase in phases.items():
        store = seed(store_redis, status, phase=json.dumps(phase), step="4")
        record = store.get("j1")
        assert record is not None
        shown = to_job(record).phase
        if status != "running":
            assert shown is None
        elif name == "training":
            assert shown is not None and shown.model_dump() == {
                "name": "training",
                "done": 4,
                "total": 10,
            }
        else:
            assert shown is not None and shown.model_dump() == phase


def test_warnings_of_a_finished_job_reach_its_record(store_redis: redis.Redis) -> None:
    store = seed(store_redis, "running")
    job = store.get("j1")
    assert job is not None
    warnings = [{"code": "rewards_all_zero", "message": "every reward was 0"}]
    assert store.finish(job, "succeeded", {"warnings": json.dumps(warnings)})
    record = store.get("j1")
    assert record is not None
    assert [w.model_dump() for w in to_job(record).warnings] == warnings
    assert to_job(record).phase is None


def unreachable_records(n: int) -> bytes:
    """Records whose answers are longer than a completion may be: the grader never matches."""
    rows = [{"prompt": f"{i:03d}=", "answer": "abcdefghijkl"} for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_a_job_reports_its_phases_and_ends_succeeded_with_warnings_when_it_learned_nothing(
    service: Service, alice: httpx.Client
) -> None:
    created = upload(alice, unreachable_records(24), "hard.jsonl")
    assert created.status_code == 201, created.text
    spec = jsonl_spec(created.json()["id"])  # 3 steps, the final model its one save
    spec["train"]["task"].update(warmup_steps=4, warmup_target="answer")
    answer = alice.post("/v1/jobs", json=spec)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    events = read_events(alice, job_id)
    phases = [
        (e["data"]["name"], e["data"]["done"], e["data"]["total"])
        for e in events
        if e["event"] == "phase"
    ]
    # every phase change, and a warm-up's first and last step (the steps between are throttled)
    names = [p[0] for i, p in enumerate(phases) if i == 0 or phases[i - 1][0] != p[0]]
    assert names == ["loading model", "warm-up", "training", "saving"]
    assert phases[0] == ("loading model", None, None)
    assert phases[1] == ("warm-up", 0, 4) and ("warm-up", 4, 4) in phases
    assert ("training", 0, 3) in phases
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["phase"] is None
    assert [w["code"] for w in job["warnings"]] == ["no_reward_variance", "rewards_all_zero"]
    assert job["warnings"][1]["message"].startswith("every reward of all 3 steps was 0")
    listed = alice.get("/v1/jobs").json()["items"]
    assert [w["code"] for w in next(j for j in listed if j["id"] == job_id)["warnings"]] == [
        "no_reward_variance",
        "rewards_all_zero",
    ]
