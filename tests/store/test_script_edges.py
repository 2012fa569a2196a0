"""What the API's scripts promise beyond the transition table (`tests/store/transitions.py`),
which reads a job's state, events and indexes but not the values a script writes into them:

- every entry of a tenant's job and file listings has score 0: the listings are read by lex
  (`ZREVRANGEBYLEX`), which Redis defines only for members of one score, and the entries other
  writers made (an earlier version's, the seeds') have 0 (`pdppo.store.files.listing_member`);
- a change of settings stores the version it answers, so the next change, computed from it, is
  taken and a change from the old one is a conflict;
- a cancel whose job is deleted between the API's read and its script answers `missing`;
- an Idempotency-Key lifetime of 0 keeps no key and looks none up (`_CREATE`'s "0: no key"), and
  one of a second keeps it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
import redis
import redis.asyncio as aredis

from pdppo.store.files import AsyncFileStore, FileRecord, listing_member
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.jobs.records import JobRecord
from pdppo.store.jobs.steering import AsyncSteering
from pdppo.store.keys import job_key, tenant_file_key, tenant_files_key, tenant_jobs_key
from tests.store.aio import run
from tests.support.seed import seed_job
from tests.support.stack import RedisServer

OLDER = "0000000000aa000000000002"  # an older version's entry: a larger id, listed first
NEWER = "0000000000aa000000000001"


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(server.url(), decode_responses=True)
    yield conn
    conn.close()


def file_record(tenant: str, created_ms: int, file_id: str) -> FileRecord:
    return FileRecord(
        id=file_id, tenant=tenant, filename="a.jsonl", bytes=10, records=1, sha256="ab" * 32,
        created_at="2026-01-01T00:00:00Z", purpose="train",
        member=listing_member(created_ms, file_id),
    )  # fmt: skip


def test_a_created_job_and_file_are_listed_at_score_0_among_the_entries_there(
    r: redis.Redis, server: RedisServer
) -> None:
    seed_job(r, OLDER, "succeeded", tenant="alice")  # at score 0
    older = file_record("alice", 2, "file-" + "22" * 16)
    r.hset(tenant_file_key("alice", older.id), mapping=older.fields())
    r.zadd(tenant_files_key("alice"), {older.member: 0})

    async def work(conn: aredis.Redis) -> tuple[list[str], list[str]]:
        store = AsyncJobStore(conn)
        await store.create(
            tenant="alice", queue="cpu", name=None, spec_json="{}", total_steps=1,
            max_active=5, idempotency=None, idempotency_ttl=0, job_id=NEWER,
        )  # fmt: skip
        made = await AsyncFileStore(conn).create(
            file_record("alice", 1, "file-" + "11" * 16), max_files=5, max_bytes=100
        )
        assert made.outcome == "created"
        jobs, _ = await store.list_jobs("alice", limit=10, cursor=None, status=None)
        files, _ = await AsyncFileStore(conn).list_files("alice", limit=10)
        return [job.id for job in jobs], [f.member for f in files]

    jobs, files = run(server, work)
    assert jobs == [OLDER, NEWER]
    assert files == [older.member, listing_member(1, "file-" + "11" * 16)]
    assert r.zrange(tenant_jobs_key("alice"), 0, -1, withscores=True) == [
        (NEWER, 0.0),
        (OLDER, 0.0),
    ]
    assert {score for _, score in r.zrange(tenant_files_key("alice"), 0, -1, withscores=True)} == {
        0.0
    }


def test_each_change_of_settings_is_computed_from_the_version_the_last_one_stored(
    r: redis.Redis, server: RedisServer
) -> None:
    seed_job(r, NEWER, "running")

    async def work(conn: aredis.Redis) -> list[tuple[str, str]]:
        steering = AsyncSteering(conn)
        return [
            await steering.patch(NEWER, 0, {"lr": 0.1}, None, "lr 0.1"),
            await steering.patch(NEWER, 1, {"lr": 0.2}, None, "lr 0.2"),
            await steering.patch(NEWER, 1, {"lr": 0.3}, None, "lr 0.3"),  # computed from 1: lost
        ]

    assert run(server, work) == [("patched", "1"), ("patched", "2"), ("conflict", "2")]
    assert r.hmget(job_key(NEWER), ["config_version", "overrides"]) == ["2", '{"lr": 0.2}']


def test_a_cancel_of_a_job_deleted_after_the_api_read_it_answers_missing(
    r: redis.Redis, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_job(r, NEWER, "succeeded", tenant="alice")

    async def work(conn: aredis.Redis) -> str:
        store = AsyncJobStore(conn)
        read = await store.get(NEWER)
        await conn.delete(job_key(NEWER))  # a delete that lands between the read and the script

        async def stale(job_id: str) -> JobRecord | None:
            return read

        monkeypatch.setattr(store, "get", stale)
        return await store.cancel(NEWER)

    assert run(server, work) == "missing"
    assert r.exists(job_key(NEWER)) == 0


def create_with_key(server: RedisServer, *calls: tuple[str, int]) -> list[str]:
    """`outcome:job id` of each create of (job id, key lifetime), all under Idempotency-Key k."""

    async def work(conn: aredis.Redis) -> list[str]:
        store = AsyncJobStore(conn)
        out = []
        for job_id, ttl in calls:
            done = await store.create(
                tenant="alice", queue="cpu", name=None, spec_json="{}", total_steps=1,
                max_active=5, idempotency="k", idempotency_ttl=ttl, job_id=job_id,
            )  # fmt: skip
            out.append(f"{done.outcome}:{done.job_id}")
        return out

    return cast(list[str], run(server, work))


def test_a_key_lifetime_of_0_looks_no_key_up(server: RedisServer) -> None:
    """Even one kept by an earlier create (of a longer lifetime)."""
    assert create_with_key(server, (OLDER, 60), (NEWER, 0)) == [
        f"created:{OLDER}",
        f"created:{NEWER}",
    ]


def test_a_key_lifetime_of_1_second_keeps_the_key(server: RedisServer) -> None:
    assert create_with_key(server, (NEWER, 1), (OLDER, 1)) == [
        f"created:{NEWER}",
        f"existing:{NEWER}",
    ]
