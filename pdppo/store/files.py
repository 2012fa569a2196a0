"""Uploaded files' records: what `GET /v1/files` lists and what a job's file id resolves to.

The bytes are on disk (`pdppo.files`); Redis holds, per tenant, one hash per file (id, name,
size, records, sha256, time, purpose), a sorted set that lists them newest first, and the bytes
they add up to. Creating (under the tenant's quotas) and deleting (unless an active job names the
file: `pdppo.store.deletion`) are each one Lua script, so the hash, the listing and the byte count
never disagree.

A file's id comes from its content, so the same bytes uploaded twice by one tenant are one file,
and the same bytes uploaded by two tenants are two records (and two files on disk) under the same
id: every key is per tenant, and another tenant's file is simply not there (404).

Writers of one file (an upload putting it in place, a delete removing it) hold a short lock on
(tenant, file id) around "disk, then record" and "record, then disk": without it, a delete could
remove the file an upload of the same content had just renamed into place, leaving a record
without its file.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal, cast

import redis
import redis.asyncio as aredis

from pdppo.store.keys import (
    tenant_file_bytes_key,
    tenant_file_key,
    tenant_file_lock_key,
    tenant_files_key,
)

LOCK_SECONDS = 30.0
"""A writer's lock expires after this long, so that one that died never blocks the file."""
LOCK_WAIT_SECONDS = 10.0

# KEYS: file hash, tenant's files (sorted set), tenant's byte count; ARGV: listing member, bytes,
# max files, max bytes, then the hash's field/value pairs.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {'existing', ''} end
local count = redis.call('ZCARD', KEYS[2])
if count >= tonumber(ARGV[3]) then return {'files_limit', tostring(count)} end
local used = tonumber(redis.call('GET', KEYS[3]) or '0')
if used + tonumber(ARGV[2]) > tonumber(ARGV[4]) then return {'bytes_limit', tostring(used)} end
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], 0, ARGV[1])
redis.call('INCRBY', KEYS[3], ARGV[2])
return {'created', ''}
"""

# KEYS: lock; ARGV: token. Only the holder releases its lock (an expired one may be another's).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def listing_member(created_ms: int, file_id: str) -> str:
    """The sorted-set member that orders files newest first (all scores are 0, members compare
    as bytes) and is the page cursor: `<13-digit ms>-<file id>`."""
    return f"{created_ms:013d}-{file_id}"


CURSOR_PATTERN = r"^[0-9]{13}-file-[0-9a-f]{32}$"
FILE_ID_PATTERN = r"^file-[0-9a-f]{32}$"


@dataclass(frozen=True)
class FileRecord:
    """The file's hash, decoded; `api.schemas.FileObject` is its public face."""

    id: str
    tenant: str
    filename: str
    bytes: int
    records: int
    sha256: str
    created_at: str
    purpose: str | None
    member: str

    @classmethod
    def from_hash(cls, raw: dict[str, str]) -> FileRecord:
        return cls(
            id=raw["id"],
            tenant=raw["tenant"],
            filename=raw.get("filename", ""),
            bytes=int(raw["bytes"]),
            records=int(raw.get("records", 0)),
            sha256=raw["sha256"],
            created_at=raw["created_at"],
            purpose=raw.get("purpose") or None,
            member=raw["member"],
        )

    def fields(self) -> dict[str, str]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "filename": self.filename,
            "bytes": str(self.bytes),
            "records": str(self.records),
            "sha256": self.sha256,
            "created_at": self.created_at,
            "purpose": self.purpose or "",
            "member": self.member,
        }


@dataclass(frozen=True)
class CreateFileResult:
    outcome: Literal["created", "existing", "files_limit", "bytes_limit"]
    used: int = 0  # files_limit: the tenant's files; bytes_limit: their bytes


class FileBusy(Exception):
    """Another writer held the file's lock for longer than we waited."""


class AsyncFileStore:
    """What the API does to file records, over the job store's `redis.asyncio` client."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._create = client.register_script(_CREATE)
        self._release = client.register_script(_RELEASE)

    async def get(self, tenant: str, file_id: str) -> FileRecord | None:
        raw = cast(dict[str, str], await self.redis.hgetall(tenant_file_key(tenant, file_id)))
        return FileRecord.from_hash(raw) if raw else None

    async def existing(self, tenant: str, file_ids: list[str]) -> set[str]:
        """Which of `file_ids` the tenant has."""
        pipe = self.redis.pipeline(transaction=False)
        for file_id in file_ids:
            pipe.exists(tenant_file_key(tenant, file_id))
        found = await pipe.execute()
        return {file_id for file_id, n in zip(file_ids, found, strict=True) if n}

    async def usage(self, tenant: str) -> tuple[int, int]:
        """(files, bytes) the tenant keeps."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(tenant_files_key(tenant))
        pipe.get(tenant_file_bytes_key(tenant))
        count, used = await pipe.execute()
        return int(count), int(used or 0)

    async def list_files(
        self,
        tenant: str,
        *,
        limit: int,
        cursor: str | None = None,
        ascending: bool = False,
        purpose: str | None = None,
    ) -> tuple[list[FileRecord], str | None]:
        """One page, newest first (oldest with `ascending`); the cursor is the last member of
        the previous page, in either order. With `purpose`, only the files uploaded with it: the
        walk reads on past the others, so it costs up to the tenant's files
        (PDPPO_MAX_FILES_PER_TENANT), a pipeline per hundred."""
        key = tenant_files_key(tenant)
        found: list[FileRecord] = []
        after = cursor
        while len(found) <= limit:
            want = limit + 1 - len(found) if purpose is None else 100
            if ascending:
                lower = f"({after}" if after else "-"
                got = await self.redis.zrangebylex(key, lower, "+", start=0, num=want)
            else:
                upper = f"({after}" if after else "+"
                got = await self.redis.zrevrangebylex(key, upper, "-", start=0, num=want)
            members = cast(list[str], got)
            pipe = self.redis.pipeline(transaction=False)
            for member in members:
                pipe.hgetall(tenant_file_key(tenant, member.split("-", 1)[1]))
            raws = await pipe.execute()
            for raw in raws:
                if not raw:  # deleted in between: gone
                    continue
                record = FileRecord.from_hash(raw)
                if purpose is None or record.purpose == purpose:
                    found.append(record)
            if len(members) < want:
                break
            after = members[-1]
        page = found[:limit]
        next_cursor = page[-1].member if len(found) > limit else None
        return page, next_cursor

    async def create(
        self, record: FileRecord, *, max_files: int, max_bytes: int
    ) -> CreateFileResult:
        """The record, under the tenant's quotas; `existing` if the tenant has the file."""
        flat = [item for pair in record.fields().items() for item in pair]
        tenant = record.tenant
        outcome, used = await self._create(
            keys=[
                tenant_file_key(tenant, record.id),
                tenant_files_key(tenant),
                tenant_file_bytes_key(tenant),
            ],
            args=[record.member, record.bytes, max_files, max_bytes, *flat],
        )
        return CreateFileResult(
            cast(Literal["created", "existing", "files_limit", "bytes_limit"], outcome),
            int(used or 0),
        )

    @asynccontextmanager
    async def lock(self, tenant: str, file_id: str) -> AsyncIterator[None]:
        """Holds the (tenant, file id) writers' lock; FileBusy after LOCK_WAIT_SECONDS. Held for
        a rename or an unlink and a script, far below LOCK_SECONDS."""
        key = tenant_file_lock_key(tenant, file_id)
        token = secrets.token_hex(16)
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while not await self.redis.set(key, token, nx=True, px=int(LOCK_SECONDS * 1000)):
            if time.monotonic() > deadline:
                raise FileBusy(f"file {file_id!r} is being written by another request")
            await asyncio.sleep(0.02)
        try:
            yield
        finally:
            await self._release(keys=[key], args=[token])


class FileStore:
    """What a worker reads of file records (sync redis-py, the job process's client)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def get(self, tenant: str, file_id: str) -> FileRecord | None:
        raw = cast(dict[str, str], self.redis.hgetall(tenant_file_key(tenant, file_id)))
        return FileRecord.from_hash(raw) if raw else None
