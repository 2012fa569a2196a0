"""Jobs put in a state for the tests: `seed_job` writes its hash and the indexes that state
implies, as the store's own scripts would have left them; `running_job` claims one through the
store; `job` is a record alone.

The scripts read the indexes as much as the hash (a cancel takes a queued job out of the outbox,
a finish out of the tenant's active set), so a seed that wrote the hash alone would test a state
the store never reaches. Before this helper each store test file had a seeding function of its
own (`seed_job`, `seed`, `_job`, `running_job`), each writing a different part of the indexes.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, cast

import redis

from pdppo.store import JobRecord, JobStore, events_key
from pdppo.store.jobs.fair import flow_of
from pdppo.store.keys import (
    OUTBOX,
    RUNNING_SET,
    fair_flows_key,
    fair_jobs_key,
    fair_tenants_key,
    job_key,
    lease_key,
    now_iso,
    tenant_active_key,
    tenant_jobs_key,
)

ACTIVE = ("queued", "running", "paused")


def seed_job(
    client: redis.Redis,
    job_id: str,
    status: str,
    *,
    tenant: str = "t",
    queue: str = "cpu",
    lease_token: str | None = None,
    spec: str = "{}",
    **fields: str,
) -> None:
    """The job `job_id` of `tenant` in `status`, with `fields` added to its hash: listed for its
    tenant; active (queued, running, paused) in the tenant's active set; queued in the outbox;
    running in the running set; one claimed once with its `started_at`, an ended one with its
    `finished_at` (unless `fields` names them). A queued one is in its queue's fair order too.
    `lease_token`: the job's lease, held by that token (a running job's worker, or one that has
    ended it and not yet let go)."""
    now = now_iso()
    record = {
        "id": job_id,
        "tenant": tenant,
        "status": status,
        "queue": queue,
        "spec": spec,
        "created_at": now,
        "updated_at": now,
        "total_steps": "10",
        "attempts": "0" if status == "queued" else "1",
    }
    if status != "queued":
        record["started_at"] = now
    if status not in ACTIVE:
        record["finished_at"] = now
    client.hset(job_key(job_id), mapping={**record, **fields})
    client.zadd(tenant_jobs_key(tenant), {job_id: 0})
    if status in ACTIVE:
        client.sadd(tenant_active_key(tenant), job_id)
    if status == "queued":
        client.zadd(OUTBOX, {job_id: 0})
        flow = flow_of(fields.get("experiment"))
        client.zadd(fair_jobs_key(queue, tenant, flow), {job_id: 0})
        client.zadd(fair_flows_key(queue, tenant), {flow: 0}, nx=True)
        client.zadd(fair_tenants_key(queue), {tenant: 0}, nx=True)
    if status == "running":
        client.sadd(RUNNING_SET, job_id)
    if lease_token is not None:
        client.set(lease_key(job_id), lease_token, px=60_000)


TOTAL = 40


def job(status: str) -> JobRecord:
    """A job record in `status`, every other field empty: for the routes' helpers that read one."""
    values = {f.name: None for f in dataclasses.fields(JobRecord)}
    values |= {"id": "j1", "tenant": "t", "status": status, "queue": "cpu", "step": 0}
    return JobRecord(**values)  # type: ignore[arg-type]


def running_job(client: redis.Redis, job_id: str = "j1", total_steps: int = TOTAL) -> JobRecord:
    """A job record claimed by worker w1, as the job process finds its job."""
    fields = {
        "id": job_id,
        "tenant": "t",
        "status": "queued",
        "queue": "cpu",
        "spec": "{}",
        "created_at": now_iso(),
        "total_steps": str(total_steps),
    }
    client.hset(job_key(job_id), mapping=cast(dict[Any, Any], fields))
    store = JobStore(client)
    assert store.claim(job_id, "w1")
    record = store.get(job_id)
    assert record is not None
    return record


def stream(client: redis.Redis, job_id: str) -> list[tuple[str, Any]]:
    """The job's events stream as (type, data), oldest first."""
    entries = cast(list[tuple[str, dict[str, str]]], client.xrange(events_key(job_id)))
    return [(fields["type"], json.loads(fields["data"])) for _, fields in entries]
