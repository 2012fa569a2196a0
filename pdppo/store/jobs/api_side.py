"""The job operations the API runs: create under the tenant's quota, read, list, cancel, fail.

A thin front end of `pdppo.store.jobs.transitions` for the changes (create, cancel, and fail,
which is the workers' `Finish`), plus the reads. Creating also puts the job in the enqueue outbox
(`pdppo.store.jobs.outbox`): the API publishes the task right after, and if it dies first, a
worker's dispatcher does, so a job that exists always gets a task; cancelling a queued job takes
it out again.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import redis.asyncio as aredis

from pdppo.store.experiments import AsyncExperimentStore
from pdppo.store.files import AsyncFileStore
from pdppo.store.jobs.events import AsyncEventStore, log_data, status_data
from pdppo.store.jobs.outbox import DEFAULT_GRACE_SECONDS
from pdppo.store.jobs.records import CreateResult, JobRecord, record_or_none
from pdppo.store.jobs.steering import AsyncSteering
from pdppo.store.jobs.transitions import Cancel, Create, Finish
from pdppo.store.keys import (
    PREFIX,
    idempotency_key,
    job_key,
    new_job_id,
    now_iso,
    spec_digest,
    tenant_active_key,
    tenant_jobs_key,
)
from pdppo.store.metadata import AsyncMetadataIndex
from pdppo.store.webhooks.endpoints import AsyncWebhookStore


class AsyncJobStore:
    """What the API does to jobs, over `redis.asyncio` (decode_responses=True).

    It owns the client; the per-resource stores it builds (`events`, `files`) share it, and the
    event and metrics reads below delegate to them.
    """

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self.events = AsyncEventStore(client)
        self.files = AsyncFileStore(client)
        self.steering = AsyncSteering(client)
        self.webhooks = AsyncWebhookStore(client)
        self.metadata = AsyncMetadataIndex(client)
        self.experiments = AsyncExperimentStore(client)

    async def create(
        self,
        *,
        tenant: str,
        queue: str,
        name: str | None,
        spec_json: str,
        total_steps: int,
        max_active: int,
        idempotency: str | None,
        idempotency_ttl: int,
        dispatch_grace: float = DEFAULT_GRACE_SECONDS,
        job_id: str | None = None,
        openai_json: str | None = None,
        experiment: str | None = None,
    ) -> CreateResult:
        """Create the job under the quota, or find the one `idempotency` already made. A new job
        enters the outbox in the same script: if its task is not in the broker `dispatch_grace`
        seconds from now (the caller died before publishing it), a dispatcher publishes it.
        `job_id`: the id to give it (`new_job_id()`), chosen by a caller that must be able to
        name the job should the store not answer. `openai_json`: the OpenAI request that made
        it (`JobRecord.openai`). `experiment`: the experiment it is a child of."""
        job_id = job_id or new_job_id()
        now = now_iso()
        fields = {
            "id": job_id,
            "tenant": tenant,
            "status": "queued",
            "queue": queue,
            "name": name or "",
            "spec": spec_json,
            "spec_digest": spec_digest(spec_json),
            "created_at": now,
            "updated_at": now,
            "queued_at": now,
            "total_steps": str(total_steps),
            "attempts": "0",
        }
        if openai_json is not None:
            fields["openai"] = openai_json
        if experiment is not None:
            fields["experiment"] = experiment
        idem_key = idempotency_key(tenant, idempotency) if idempotency else f"{PREFIX}:idem:-"
        outcome, value = await Create(
            job_id=job_id,
            tenant=tenant,
            idempotency_key=idem_key,
            max_active=max_active,
            idempotency_ttl=idempotency_ttl if idempotency else 0,
            status_data=status_data("queued"),
            check_at=time.time() + dispatch_grace,
            fields=fields,
        ).arun(self.redis)
        if outcome == "limit":
            return CreateResult("limit", None, int(value))
        if outcome == "created":
            return CreateResult(outcome, value, record=JobRecord.from_hash(fields))
        return CreateResult(outcome, value)

    async def get(self, job_id: str) -> JobRecord | None:
        raw = await self.redis.hgetall(job_key(job_id))
        return record_or_none(cast(dict[str, str], raw))

    async def idempotent_job(self, tenant: str, key: str) -> JobRecord | None:
        """The job `key` (an Idempotency-Key of `tenant`) made, while the key lives; None when
        it made none (or the job is deleted)."""
        job_id = await self.redis.get(idempotency_key(tenant, key))
        return await self.get(str(job_id)) if job_id else None

    async def list_jobs(
        self, tenant: str, *, limit: int, cursor: str | None, status: str | None
    ) -> tuple[list[JobRecord], str | None]:
        """Newest first from the tenant's index, filtered; the cursor is the last id returned."""
        if status in ("queued", "running", "paused"):
            return await self._list_active(tenant, limit=limit, cursor=cursor, status=status)
        key = tenant_jobs_key(tenant)
        out: list[JobRecord] = []
        upper = f"({cursor}" if cursor else "+"
        batch = max(limit, 50) if status else limit
        while True:
            found = await self.redis.zrevrangebylex(key, upper, "-", start=0, num=batch)
            ids = cast(list[str], found)
            pipe = self.redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(job_key(job_id))
            for job_id, raw in zip(ids, await pipe.execute(), strict=True):
                upper = f"({job_id}"
                record = record_or_none(raw)
                if record is None or (status is not None and record.status != status):
                    continue
                out.append(record)
                if len(out) == limit:
                    more = await self.redis.zrevrangebylex(key, upper, "-", start=0, num=1)
                    return out, (job_id if more else None)
            if len(ids) < batch:
                return out, None

    async def _list_active(
        self, tenant: str, *, limit: int, cursor: str | None, status: str
    ) -> tuple[list[JobRecord], str | None]:
        """Queued, running or paused jobs come from the small active set (bounded by the quota), not
        from a scan of the tenant's whole history."""
        members = cast(set[str], await self.redis.smembers(tenant_active_key(tenant)))
        ids = sorted((i for i in members if cursor is None or i < cursor), reverse=True)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(job_key(job_id))
        records = [record_or_none(raw) for raw in await pipe.execute()]
        matching = [r for r in records if r is not None and r.status == status]
        page = matching[:limit]
        return page, (page[-1].id if len(matching) > limit else None)

    async def cancel(self, job_id: str) -> str:
        """'cancelled-while-queued' (or -paused), 'requested' (running), 'already-<status>' or
        'missing'."""
        record = await self.get(job_id)
        if record is None:
            return "missing"
        return await Cancel(
            job_id=job_id,
            tenant=record.tenant,
            now=now_iso(),
            status_data=status_data("cancelled"),
            done_data=json.dumps({"status": "cancelled"}),
            log_data=log_data(
                "cancel requested; the job stops within seconds, keeping its last checkpoint"
            ),
        ).arun(self.redis)

    async def fail(self, job: JobRecord, code: str, message: str) -> bool:
        return await Finish(
            job_id=job.id,
            tenant=job.tenant,
            status="failed",
            now=now_iso(),
            status_data=status_data("failed"),
            done_data=json.dumps({"status": "failed"}),
            fields={"error_code": code, "error_message": message},
        ).arun(self.redis)

    async def metrics_history(self, job_id: str) -> list[dict[str, Any]]:
        return await self.events.metrics_history(job_id)

    async def last_event_id(self, job_id: str) -> str:
        return await self.events.last_event_id(job_id)
