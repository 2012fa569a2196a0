"""The deletion scripts (`pdppo.store.deletion`) on a real Redis, as tables of states x requests.

Each row seeds one job (or file) in a state, runs one request and checks its answer and exactly
which keys are left. Two tenants name the same file id and the same `job:<id>` model, so that a
rule that read another tenant's jobs would show."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis

from pdppo.store.deletion import PURGE_SET, AsyncDeletion, Deletion, Retention
from pdppo.store.keys import (
    OUTBOX,
    RUNNING_SET,
    eval_key,
    events_key,
    job_key,
    lease_key,
    metrics_key,
    samples_key,
    tenant_active_key,
    tenant_file_bytes_key,
    tenant_file_key,
    tenant_files_key,
    tenant_jobs_key,
)
from tests.support.stack import RedisServer

FILE = "file-" + "ab" * 16
TARGET = "0000000000aa000000000001"
OLD = "2026-01-01T00:00:00.000Z"
CUTOFF = "2026-06-01T00:00:00.000Z"
NEW = "2026-11-01T00:00:00.000Z"
ACTIVE = ("queued", "running", "paused")
ENDED = ("succeeded", "failed", "cancelled")


@pytest.fixture
def sync(server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(server.url(), decode_responses=True)
    yield conn
    conn.close()


def seed_job(
    r: redis.Redis,
    job_id: str,
    status: str,
    *,
    tenant: str = "alice",
    file: str | None = None,
    model: str = "builtin:tiny",
    finished_at: str | None = OLD,
) -> None:
    spec = {"train": {"model": {"name": model}, "task": {"name": "jsonl", "file": file}}}
    fields = {"id": job_id, "tenant": tenant, "status": status, "spec": json.dumps(spec)}
    fields |= {"created_at": OLD, "updated_at": OLD}
    if status in ENDED and finished_at:
        fields["finished_at"] = finished_at
    r.hset(job_key(job_id), mapping=fields)
    r.zadd(tenant_jobs_key(tenant), {job_id: 0})
    if status in ACTIVE:
        r.sadd(tenant_active_key(tenant), job_id)
    if status == "running":
        r.sadd(RUNNING_SET, job_id)
    if status == "queued":
        r.zadd(OUTBOX, {job_id: 1})
    r.xadd(events_key(job_id), {"type": "status", "data": "{}"})
    for key in (metrics_key(job_id), eval_key(job_id), samples_key(job_id)):
        r.rpush(key, "{}")


def seed_file(r: redis.Redis, tenant: str, file_id: str = FILE, size: int = 100) -> None:
    member = f"{1:013d}-{file_id}"
    r.hset(
        tenant_file_key(tenant, file_id),
        mapping={"id": file_id, "tenant": tenant, "bytes": size, "sha256": "ab" * 32,
                 "created_at": OLD, "member": member},
    )  # fmt: skip
    r.zadd(tenant_files_key(tenant), {member: 0})
    r.incrby(tenant_file_bytes_key(tenant), size)


def run_async(server: RedisServer, call: str, *args: str) -> Deletion:
    async def main() -> Deletion:
        conn = aredis.Redis.from_url(server.url(), decode_responses=True)
        try:
            result: Deletion = await getattr(AsyncDeletion(conn), call)(*args)
            return result
        finally:
            await conn.aclose()

    return asyncio.run(main())


def job_keys_left(r: redis.Redis, job_id: str) -> list[str]:
    keys = [job_key(job_id), events_key(job_id), metrics_key(job_id), eval_key(job_id)]
    keys.append(samples_key(job_id))
    names = ["job", "events", "metrics", "eval", "samples"]
    return [name for name, key in zip(names, keys, strict=True) if r.exists(key)]


# (state of TARGET, what else exists, expected outcome)
JOB_ROWS = [
    *[(st, "", Deletion("active", status=st)) for st in ACTIVE],
    *[(st, "", Deletion("deleted")) for st in ENDED],
    ("succeeded", "lease", Deletion("leased")),
    ("succeeded", "queued user", Deletion("used", users=("0000000000bb000000000001",))),
    ("succeeded", "paused user", Deletion("used", users=("0000000000bb000000000001",))),
    ("succeeded", "ended user", Deletion("deleted")),
    ("succeeded", "bob's queued user", Deletion("deleted")),
    ("succeeded", "queued non-user", Deletion("deleted")),  # starts from another model
    ("succeeded", "asked by bob", Deletion("missing")),
    ("none", "", Deletion("missing")),
]


@pytest.mark.parametrize(("state", "other", "expected"), JOB_ROWS)
def test_delete_job(
    server: RedisServer, sync: redis.Redis, state: str, other: str, expected: Deletion
) -> None:
    if state != "none":
        seed_job(sync, TARGET, state)
    user = "0000000000bb000000000001"
    if other == "lease":
        sync.set(lease_key(TARGET), "worker-1:token")
    elif other.endswith("non-user"):
        seed_job(sync, user, other.split()[0], model="builtin:tiny")
    elif other.endswith("user"):
        status = other.split()[-2]
        tenant = "bob" if other.startswith("bob") else "alice"
        seed_job(sync, user, status, tenant=tenant, model=f"job:{TARGET}")
    tenant = "bob" if other == "asked by bob" else "alice"

    got = run_async(server, "delete_job", TARGET, tenant)

    assert got == expected
    if got.outcome == "deleted":
        assert job_keys_left(sync, TARGET) == []
        assert sync.zscore(tenant_jobs_key("alice"), TARGET) is None
        assert sync.zscore(PURGE_SET, TARGET) is not None
    elif state != "none":
        assert job_keys_left(sync, TARGET) == ["job", "events", "metrics", "eval", "samples"]
        assert sync.hget(job_key(TARGET), "status") == state
        assert sync.zscore(PURGE_SET, TARGET) is None
    if state == "queued":
        assert sync.zscore(OUTBOX, TARGET) == 1  # untouched


FILE_ROWS = [
    ("", Deletion("deleted", sha256="ab" * 32)),
    *[
        (f"alice {st}", Deletion("used", users=("0000000000cc000000000001",)))
        for st in ("queued", "running", "paused")
    ],
    *[(f"alice {st}", Deletion("deleted", sha256="ab" * 32)) for st in ENDED],
    ("bob queued", Deletion("deleted", sha256="ab" * 32)),  # bob's job uses bob's copy
    ("alice queued other-file", Deletion("deleted", sha256="ab" * 32)),
    ("alice queued no-task", Deletion("deleted", sha256="ab" * 32)),  # see SPECS
    ("alice queued no-train", Deletion("deleted", sha256="ab" * 32)),
    ("alice queued not-json", Deletion("deleted", sha256="ab" * 32)),
]

# the spec of a job that uses no file (`no-task`, `no-train`, `not-json`: specs as the API never
# writes but a record may hold, `{}` as the store's tests seed: the scripts read them without
# failing)
SPECS: dict[str, object] = {
    "other-file": {"train": {"task": {"file": "file-" + "cd" * 16, "validation_file": None}}},
    "no-task": {"train": {"model": {"name": "builtin:tiny"}, "task": None}},
    "no-train": {},
    "not-json": "{",
}


@pytest.mark.parametrize(("user", "expected"), FILE_ROWS)
def test_delete_file(server: RedisServer, sync: redis.Redis, user: str, expected: Deletion) -> None:
    seed_file(sync, "alice", size=100)
    seed_file(sync, "bob", size=70)  # the same bytes, so the same id
    if user:
        tenant, status, *kind = user.split()
        seed_job(sync, "0000000000cc000000000001", status, tenant=tenant, file=FILE)
        if kind:
            found = SPECS[kind[0]]
            spec = found if isinstance(found, str) else json.dumps(found)
            sync.hset(job_key("0000000000cc000000000001"), "spec", spec)

    got = run_async(server, "delete_file", "alice", FILE)

    assert got == expected
    gone = got.outcome == "deleted"
    assert sync.exists(tenant_file_key("alice", FILE)) == (0 if gone else 1)
    assert sync.zcard(tenant_files_key("alice")) == (0 if gone else 1)
    assert sync.get(tenant_file_bytes_key("alice")) == ("0" if gone else "100")
    # bob's copy is bob's, whatever happened to alice's
    assert sync.hget(tenant_file_key("bob", FILE), "bytes") == "70"
    assert sync.zcard(tenant_files_key("bob")) == 1
    assert sync.get(tenant_file_bytes_key("bob")) == "70"


def test_delete_file_that_is_not_there(server: RedisServer, sync: redis.Redis) -> None:
    seed_file(sync, "bob")
    assert run_async(server, "delete_file", "alice", FILE) == Deletion("missing")
    assert sync.exists(tenant_file_key("bob", FILE)) == 1


# (state, finished, other, keep final, expected)
EXPIRE_ROWS = [
    *[(st, OLD, "", True, "active") for st in ACTIVE],
    *[(st, OLD, "", True, "expire") for st in ENDED],
    *[(st, NEW, "", True, "recent") for st in ENDED],
    ("succeeded", OLD, "lease", True, "leased"),
    ("succeeded", OLD, "queued user", True, "expire"),  # final/ stays for it
    ("succeeded", OLD, "queued user", False, "used"),
    ("succeeded", OLD, "bob's queued user", False, "expire"),
    ("succeeded", OLD, "queued non-user", False, "expire"),  # starts from another model
    ("failed", OLD, "marked", True, "expired"),
    ("cancelled", None, "", True, "expire"),  # no finished_at: its last update counts
]


@pytest.mark.parametrize(("state", "finished", "other", "keep", "expected"), EXPIRE_ROWS)
def test_expire(
    sync: redis.Redis, state: str, finished: str | None, other: str, keep: bool, expected: str
) -> None:
    seed_job(sync, TARGET, state, finished_at=finished)
    if other == "lease":
        sync.set(lease_key(TARGET), "worker-1:token")
    elif other == "marked":
        sync.hset(job_key(TARGET), "artifacts_expired_at", OLD)
    elif other == "queued non-user":
        seed_job(sync, "0000000000dd000000000001", "queued", model="builtin:tiny")
    elif other:
        tenant = "bob" if other.startswith("bob") else "alice"
        seed_job(sync, "0000000000dd000000000001", "queued", tenant=tenant, model=f"job:{TARGET}")

    sync.hset(job_key(TARGET), "final_model", "/artifacts/x/final")
    got = Retention(sync).expire(TARGET, "alice", cutoff=CUTOFF, now=NEW, keep_final=keep)

    assert got == expected
    model_kept = got != "expire" or (keep and state == "succeeded")
    assert sync.hget(job_key(TARGET), "final_model") == (
        "/artifacts/x/final" if model_kept else None
    )
    marked = sync.hget(job_key(TARGET), "artifacts_expired_at")
    assert marked == {"expire": NEW, "expired": OLD}.get(got)
    assert sync.hget(job_key(TARGET), "status") == state
    assert Retention(sync).expire(TARGET, "bob", cutoff=CUTOFF, now=NEW, keep_final=keep) == (
        "missing"
    )
