"""The file records' scripts (`pdppo.store.files`) on a real Redis, as tables: creating a record
under the tenant's quotas of files and bytes (each limit at, under and over its edge), and the
writers' lock, which only its holder releases."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from pdppo.store.files import AsyncFileStore, FileRecord, listing_member
from pdppo.store.keys import tenant_file_bytes_key, tenant_file_lock_key, tenant_files_key
from tests.store.aio import run
from tests.support.stack import RedisServer

TENANT = "alice"


def record(n: int, size: int) -> FileRecord:
    file_id = f"file-{n:032x}"
    return FileRecord(
        id=file_id, tenant=TENANT, filename=f"{n}.jsonl", bytes=size, records=1,
        sha256=f"{n:064x}", created_at="2026-01-01T00:00:00Z", purpose="train",
        member=listing_member(n, file_id),
    )  # fmt: skip


# sizes of the files the tenant has, the new file (same id as the first: 0), its size, at most
# files, at most bytes -> outcome, the number it reports, the tenant's files and bytes after
CASES = [
    ([], 1, 10, 2, 100, "created", 0, 1, 10),
    ([10], 1, 10, 2, 100, "created", 0, 2, 20),
    ([10], 0, 10, 2, 100, "existing", 0, 1, 10),  # the same bytes again: one file
    ([10], 0, 10, 1, 10, "existing", 0, 1, 10),  # ... even at both limits
    ([10], 1, 10, 1, 100, "files_limit", 1, 1, 10),  # at the limit of files
    ([10, 10], 2, 10, 2, 100, "files_limit", 2, 2, 20),
    ([40], 1, 60, 2, 100, "created", 0, 2, 100),  # exactly the limit of bytes: allowed
    ([40], 1, 61, 2, 100, "bytes_limit", 40, 1, 40),  # one byte over
    ([], 1, 101, 2, 100, "bytes_limit", 0, 0, 0),
]


@pytest.mark.parametrize(
    ("have", "new", "size", "max_files", "max_bytes", "outcome", "used", "files", "total"), CASES
)
def test_create_under_the_quotas(
    server: RedisServer,
    have: list[int],
    new: int,
    size: int,
    max_files: int,
    max_bytes: int,
    outcome: str,
    used: int,
    files: int,
    total: int,
) -> None:
    async def work(conn: aredis.Redis) -> tuple[str, int, int, int]:
        store = AsyncFileStore(conn)
        for n, bytes_ in enumerate(have):
            assert (await store.create(record(n, bytes_), max_files=9, max_bytes=999)).outcome == (
                "created"
            )
        done = await store.create(record(new, size), max_files=max_files, max_bytes=max_bytes)
        count, kept = await store.usage(TENANT)
        return done.outcome, done.used, count, kept

    assert run(server, work) == (outcome, used, files, total)


def test_the_lock_is_released_by_its_holder_only(server: RedisServer) -> None:
    key = tenant_file_lock_key(TENANT, "file-" + "0" * 32)

    async def work(conn: aredis.Redis) -> list[object]:
        store = AsyncFileStore(conn)
        seen: list[object] = []
        async with store.lock(TENANT, "file-" + "0" * 32):
            seen.append(await conn.exists(key))
        seen.append(await conn.exists(key))  # its holder let go
        async with store.lock(TENANT, "file-" + "0" * 32):
            await conn.set(key, "another-writer")  # expired, and taken by another meanwhile
        seen.append(await conn.get(key))  # not released: it is another writer's now
        return seen

    assert run(server, work) == [1, 0, "another-writer"]


def test_a_record_is_listed_and_counted_once(server: RedisServer) -> None:
    async def work(conn: aredis.Redis) -> tuple[list[str], str | None]:
        store = AsyncFileStore(conn)
        for _ in range(2):
            await store.create(record(7, 30), max_files=5, max_bytes=100)
        listed = await conn.zrange(tenant_files_key(TENANT), 0, -1)
        return listed, await conn.get(tenant_file_bytes_key(TENANT))

    assert run(server, work) == ([listing_member(7, f"file-{7:032x}")], "30")
