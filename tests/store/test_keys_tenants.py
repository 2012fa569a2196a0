"""Keys built from what a client chooses (`pdppo.store.keys`), with two tenants sending the same
value: nothing one tenant does under that value may touch, find or block the other's.

Client-chosen values that reach a key: the Idempotency-Key (`idempotency_key`), a file's id
(`tenant_file_key`, `tenant_file_lock_key`: it derives from the bytes, so two tenants uploading
the same bytes send the same id). The tenant's own keys (`tenant_jobs_key`, `tenant_active_key`,
`tenant_files_key`, `tenant_file_bytes_key`, `tenant_usage_key`) hold what each tenant lists and
counts. A job's name is a field, never a key; job ids are the server's (`new_job_id`)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from pdppo.store.deletion import AsyncDeletion
from pdppo.store.files import AsyncFileStore, FileRecord, listing_member
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.keys import (
    idempotency_key,
    tenant_active_key,
    tenant_file_bytes_key,
    tenant_file_key,
    tenant_file_lock_key,
    tenant_files_key,
    tenant_jobs_key,
    tenant_usage_key,
)
from tests.support.stack import RedisServer

FILE = "file-" + "cd" * 16
KEY = "retry-42"


@pytest.fixture
def url(server: RedisServer) -> Iterator[str]:
    yield server.url()


def run(url: str, work: Callable[[aredis.Redis], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        conn = aredis.Redis.from_url(url, decode_responses=True)
        try:
            return await work(conn)
        finally:
            await conn.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("key", "alice", "bob"),
    [
        (idempotency_key, f"pdppo:idem:alice:{hashlib.sha256(KEY.encode()).hexdigest()}",
         f"pdppo:idem:bob:{hashlib.sha256(KEY.encode()).hexdigest()}"),
        (tenant_file_key, f"pdppo:tenant:alice:file:{FILE}", f"pdppo:tenant:bob:file:{FILE}"),
        (tenant_file_lock_key, f"pdppo:tenant:alice:file:{FILE}:lock",
         f"pdppo:tenant:bob:file:{FILE}:lock"),
    ],
    ids=["idempotency", "file", "file-lock"],
)  # fmt: skip
def test_a_client_chosen_value_gives_each_tenant_its_own_key(
    key: Callable[[str, str], str], alice: str, bob: str
) -> None:
    value = KEY if key is idempotency_key else FILE
    assert (key("alice", value), key("bob", value)) == (alice, bob)


def test_the_tenants_own_keys_are_apart() -> None:
    for key in (tenant_jobs_key, tenant_active_key, tenant_files_key, tenant_file_bytes_key):
        assert key("alice") != key("bob")
    assert tenant_usage_key("alice") == "pdppo:tenant:alice:usage"


def test_the_same_idempotency_key_makes_one_job_per_tenant(url: str) -> None:
    async def create(conn: aredis.Redis, tenant: str) -> tuple[str, str | None]:
        done = await AsyncJobStore(conn).create(
            tenant=tenant, queue="cpu", name="same-name", spec_json="{}", total_steps=1,
            max_active=5, idempotency=KEY, idempotency_ttl=60,
        )  # fmt: skip
        return done.outcome, done.job_id

    async def both(conn: aredis.Redis) -> list[tuple[str, str | None]]:
        return [
            await create(conn, "alice"),
            await create(conn, "bob"),
            await create(conn, "alice"),  # a retry: alice's own job, not bob's
            await create(conn, "bob"),
        ]

    first_a, first_b, again_a, again_b = run(url, both)
    assert (first_a[0], first_b[0], again_a[0], again_b[0]) == (
        "created", "created", "existing", "existing",
    )  # fmt: skip
    assert first_a[1] != first_b[1]
    assert (again_a[1], again_b[1]) == (first_a[1], first_b[1])

    async def listed(conn: aredis.Redis, tenant: str) -> list[str]:
        jobs, _ = await AsyncJobStore(conn).list_jobs(tenant, limit=10, cursor=None, status=None)
        return [job.id for job in jobs]

    assert run(url, lambda c: listed(c, "alice")) == [first_a[1]]
    assert run(url, lambda c: listed(c, "bob")) == [first_b[1]]


def record(tenant: str, size: int) -> FileRecord:
    return FileRecord(
        id=FILE, tenant=tenant, filename="same.jsonl", bytes=size, records=2, sha256="ab" * 32,
        created_at="2026-01-01T00:00:00Z", purpose="train", member=listing_member(1, FILE),
    )  # fmt: skip


def test_the_same_file_id_is_one_record_per_tenant(url: str, server: RedisServer) -> None:
    async def work(conn: aredis.Redis) -> list[str]:
        files = AsyncFileStore(conn)
        out = [(await files.create(record(t, n), max_files=1, max_bytes=100)).outcome
               for t, n in (("alice", 10), ("bob", 30))]  # fmt: skip
        out.append((await AsyncDeletion(conn).delete_file("alice", FILE)).outcome)
        out.append((await AsyncDeletion(conn).delete_file("alice", FILE)).outcome)
        return out

    # bob's record is no `existing` of alice's, nor counted in her quota of one file
    assert run(url, work) == ["created", "created", "deleted", "missing"]
    sync = redis.Redis.from_url(server.url(), decode_responses=True)
    try:
        assert sync.hget(tenant_file_key("bob", FILE), "bytes") == "30"
        counted = [sync.get(tenant_file_bytes_key(tenant)) for tenant in ("alice", "bob")]
        assert counted == ["0", "30"]
        assert sync.zrange(tenant_files_key("bob"), 0, -1) == [listing_member(1, FILE)]
        assert sync.zcard(tenant_files_key("alice")) == 0
    finally:
        sync.close()


def test_one_tenants_lock_on_a_file_id_does_not_block_anothers(url: str) -> None:
    async def work(conn: aredis.Redis) -> str:
        files = AsyncFileStore(conn)
        async with files.lock("alice", FILE):
            # bob's lock of the same id is his own: taken at once, not after alice's 10 s wait
            async with asyncio.timeout(2):
                async with files.lock("bob", FILE):
                    return "both held"
        return "unreachable"

    assert run(url, work) == "both held"
