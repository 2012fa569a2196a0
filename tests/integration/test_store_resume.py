"""`resume` in the store (`pdppo.store.jobs.steering._RESUME`), a table of job states x what the
script answers and leaves: a job that failed for its disk is the one finished job it queues
again; any other failure, success or cancel stays as it is."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
import redis

from pdppo.store import OUTBOX, JobStore, events_key, job_key, now_iso, tenant_active_key
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.keys import lease_key
from tests.support.stack import Run

LIMIT = 2


def _job(client: redis.Redis, job_id: str, tenant: str, status: str, **extra: str) -> None:
    fields = {"id": job_id, "tenant": tenant, "status": status, "queue": "cpu", "spec": "{}"}
    fields |= {"created_at": now_iso(), **extra}
    client.hset(job_key(job_id), mapping=cast(dict[Any, Any], fields))
    if status in ("queued", "running", "paused"):
        client.sadd(tenant_active_key(tenant), job_id)


FAILED = {"finished_at": "2026-01-01T00:00:00+00:00", "error_message": "m", "error_traceback": "t"}

# state, hash fields, other active jobs of the tenant -> outcome, status after
CASES = [
    ("queued", {}, 0, "already-queued", "queued"),
    ("running", {}, 0, "already-running", "running"),
    ("running", {"pause_requested": "1"}, 0, "withdrawn", "running"),
    ("paused", {}, 0, "queued", "queued"),
    ("paused", {}, LIMIT, "queued", "queued"),  # it holds its place already
    ("succeeded", {}, 0, "already-succeeded", "succeeded"),
    ("cancelled", {}, 0, "already-cancelled", "cancelled"),
    ("failed", {**FAILED, "error_code": "training_error"}, 0, "already-failed", "failed"),
    ("failed", {**FAILED, "error_code": "out_of_memory"}, 0, "already-failed", "failed"),
    ("failed", {**FAILED, "error_code": "worker_lost"}, 0, "already-failed", "failed"),
    ("failed", {**FAILED, "error_code": "storage_full"}, 0, "queued", "queued"),
    ("failed", {**FAILED, "error_code": "storage_error"}, 0, "queued", "queued"),
    ("failed", {**FAILED, "error_code": "storage_full"}, LIMIT - 1, "queued", "queued"),
    ("failed", {**FAILED, "error_code": "storage_full"}, LIMIT, "limit", "failed"),
    # retention deleted its checkpoints (`pdppo.store.deletion`): nothing to resume from
    (
        "failed",
        {**FAILED, "error_code": "storage_full", "artifacts_expired_at": "1"},
        0,
        "expired",
        "failed",
    ),
]


@pytest.mark.parametrize(("state", "fields", "others", "outcome", "after"), CASES)
def test_resume(
    store_redis: redis.Redis,
    run_store: Run,
    state: str,
    fields: dict[str, str],
    others: int,
    outcome: str,
    after: str,
) -> None:
    for n in range(others):
        _job(store_redis, f"other{n}", "t", "running")
    _job(store_redis, "j", "t", state, **fields)
    before = store_redis.hgetall(job_key("j"))
    answer = run_store(lambda store: store.steering.resume("j", 5.0, "t", LIMIT))
    assert answer == outcome
    record = store_redis.hgetall(job_key("j"))
    assert record["status"] == after
    active = store_redis.smembers(tenant_active_key("t"))
    assert ("j" in active) == (after in ("queued", "running", "paused"))
    assert (store_redis.zscore(OUTBOX, "j") is not None) == (answer == "queued")
    if state == "failed" and after == "queued":
        assert not {"error_code", "error_message", "error_traceback", "finished_at"} & set(record)
        entries = cast(list[tuple[str, dict[str, str]]], store_redis.xrange(events_key("j")))
        events = [fields for _, fields in entries]
        assert [e["type"] for e in events] == ["log", "status"]
        assert json.loads(events[1]["data"])["status"] == "queued"
        assert "resumed after failing for its disk" in json.loads(events[0]["data"])["message"]
    elif answer not in ("queued", "withdrawn"):
        assert record == before  # nothing changed
        assert store_redis.xlen(events_key("j")) == 0


def test_resume_of_a_missing_job(run_store: Run) -> None:
    assert run_store(lambda store: store.steering.resume("nope", 5.0, "t", LIMIT)) == "missing"


def test_two_tenants_count_their_own_active_jobs(store_redis: redis.Redis, run_store: Run) -> None:
    """Same job numbering in two tenants: the limit is the resumed job's tenant's."""
    for n in range(LIMIT):
        _job(store_redis, f"a{n}", "alice", "running")
    _job(store_redis, "ja", "alice", "failed", error_code="storage_full")
    _job(store_redis, "jb", "bob", "failed", error_code="storage_full")

    async def both(store: AsyncJobStore) -> list[str]:
        return [
            await store.steering.resume("ja", 5.0, "alice", LIMIT),
            await store.steering.resume("jb", 5.0, "bob", LIMIT),
        ]

    assert run_store(both) == ["limit", "queued"]
    assert store_redis.smembers(tenant_active_key("bob")) == {"jb"}
    assert "ja" not in store_redis.smembers(tenant_active_key("alice"))


@pytest.mark.parametrize(
    ("carried_out", "said"),
    [
        (False, "pause withdrawn before the job stopped; it runs on"),
        (
            True,
            "pause withdrawn after the job had begun stopping for it: it stops at its checkpoint "
            "as planned, then is queued again to run on from there",
        ),
    ],
)
def test_a_withdrawn_pause_says_whether_the_job_runs_on(
    store_redis: redis.Redis, run_store: Run, carried_out: bool, said: str
) -> None:
    """Once its worker carries the pause out (`JobStore.begin_pause`) the job stops anyway: the
    resume said "it runs on" of it too."""
    _job(store_redis, "j", "t", "running", pause_requested="1")
    store_redis.set(lease_key("j"), "w1:token")
    if carried_out:
        assert JobStore(store_redis).begin_pause("j", lease_token="w1:token") is True
    assert run_store(lambda store: store.steering.resume("j", 5.0, "t", LIMIT)) == "withdrawn"
    entries = cast(list[tuple[str, dict[str, str]]], store_redis.xrange(events_key("j")))
    assert [json.loads(fields["data"])["message"] for _, fields in entries] == [said]
    # nothing to carry out any more
    assert JobStore(store_redis).begin_pause("j", lease_token="w1:token") is False
