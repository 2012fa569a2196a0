"""The index of OpenAI jobs by `metadata`: `GET /v1/fine_tuning/jobs?metadata[k]=v` reads the
jobs that have a pair rather than every job of the tenant (bench/openai_list_metadata.py: with
10,000 jobs a filtered listing took ~325 ms by that scan, and grew with the jobs).

Per tenant and pair, a sorted set of job ids (`tenant_metadata_key`; all scores 0, so ids sort
by time as in `tenant_jobs_key`). A job's entries are written just before the job is created
(`api.jobs.submission`), so no job is ever without them: a crash in between, or an idempotent replay
that creates nothing, leaves an entry without a job, and a deleted job leaves its entries; a walk
drops such an entry when it meets it, once its id is older than GRACE_MS (a younger one may be a
job whose create has not landed yet). Jobs made before the index are added once, by the tenant's
first filtered listing (`ensure`, a walk of all of them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, cast

import redis.asyncio as aredis

from pdppo.store.jobs.records import JobRecord, record_or_none
from pdppo.store.keys import (
    job_key,
    tenant_jobs_key,
    tenant_metadata_key,
    tenant_metadata_ready_key,
)

GRACE_MS = 60_000
"""An entry whose job is missing is kept while its id is younger than this: far longer than a
create takes between writing the entry and the job."""
BATCH = 100


def metadata_of(openai: Mapping[str, Any] | None) -> dict[str, str]:
    """The `metadata` of the OpenAI request that made a job (`JobRecord.openai`); {} for a job
    made otherwise."""
    request = (openai or {}).get("request") or {}
    return dict(request.get("metadata") or {})


def _id_ms(job_id: str) -> int:
    """When `new_job_id` made the id (its first 12 hex digits are the ms); 0 if not one of its."""
    try:
        return int(job_id[:12], 16)
    except ValueError:
        return 0


class AsyncMetadataIndex:
    """The index, over the API's `redis.asyncio` client (decode_responses=True)."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client

    async def add(self, tenant: str, job_id: str, metadata: Mapping[str, str]) -> None:
        if not metadata:
            return
        pipe = self.redis.pipeline(transaction=False)
        for key, value in metadata.items():
            pipe.zadd(tenant_metadata_key(tenant, key, value), {job_id: 0})
        await pipe.execute()

    async def ensure(self, tenant: str) -> None:
        """Adds the tenant's jobs made before the index (once: then a key says it is done)."""
        ready = tenant_metadata_ready_key(tenant)
        if await self.redis.exists(ready):
            return
        upper = "+"
        while True:
            found = await self.redis.zrevrangebylex(
                tenant_jobs_key(tenant), upper, "-", start=0, num=500
            )
            ids = cast(list[str], found)
            pipe = self.redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hget(job_key(job_id), "openai")
            made = await pipe.execute()
            pipe = self.redis.pipeline(transaction=False)
            for job_id, raw in zip(ids, made, strict=True):
                for key, value in metadata_of(json.loads(raw) if raw else None).items():
                    pipe.zadd(tenant_metadata_key(tenant, key, value), {job_id: 0})
            await pipe.execute()
            if len(ids) < 500:
                break
            upper = f"({ids[-1]}"
        await self.redis.set(ready, "1")

    async def jobs(
        self, tenant: str, wanted: Mapping[str, str], *, cursor: str | None, limit: int
    ) -> tuple[list[JobRecord], bool]:
        """Up to `limit` of the tenant's jobs whose metadata has every pair of `wanted`, newest
        first after `cursor` (a job id); and whether more follow. Walks the smallest pair's
        entries; the other pairs are checked on each job."""
        await self.ensure(tenant)
        keys = [tenant_metadata_key(tenant, k, v) for k, v in wanted.items()]
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.zcard(key)
        sizes = await pipe.execute()
        key = keys[sizes.index(min(sizes))]
        found: list[JobRecord] = []
        upper = f"({cursor}" if cursor else "+"
        stale_before = int(time.time() * 1000) - GRACE_MS
        while True:
            got = await self.redis.zrevrangebylex(key, upper, "-", start=0, num=BATCH)
            ids = cast(list[str], got)
            pipe = self.redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(job_key(job_id))
            gone: list[str] = []
            more = False
            for job_id, raw in zip(ids, await pipe.execute(), strict=True):
                upper = f"({job_id}"
                record = record_or_none(raw)
                if record is None:
                    if _id_ms(job_id) < stale_before:
                        gone.append(job_id)
                    continue
                metadata = metadata_of(record.openai)
                if all(metadata.get(k) == v for k, v in wanted.items()):
                    if len(found) == limit:
                        more = True
                        break
                    found.append(record)
            if gone:
                await self.redis.zrem(key, *gone)
            if more or len(ids) < BATCH:
                return found, more
