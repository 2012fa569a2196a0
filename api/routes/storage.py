"""What a tenant keeps: `DELETE /v1/jobs/{id}`, `GET /v1/usage`, and the storage quota.

Deleting a job removes everything of it: its record (a later GET is 404, and it leaves the
listing), its events, metrics, evaluations and samples, and its folder (checkpoints, final model,
logs, its links to uploaded files). Only an ended job can be deleted, and not while its worker
still holds it or while an active job starts from its final model (`job:<id>`): each a 409 that
says what to do (`pdppo.store.deletion` decides all of it in one script).

The quota (PDPPO_MAX_STORAGE_BYTES_PER_TENANT) counts the tenant's bytes on disk, uploads and
job folders together (`pdppo.disk_usage`: measured, not counted, and kept for
PDPPO_USAGE_CACHE_SECONDS; a delete or a new upload forgets it). A tenant at its quota gets 507
for uploads and job submissions, with a detail naming its bytes and how to free them. 507
(Insufficient Storage) rather than 429: the request is refused for room, not for its rate, and
retrying it later does not help until something is deleted; a 429 tells clients to back off and
retry. A job that runs keeps running past the quota (its checkpoints are what makes it
resumable); the tenant's next upload or job is refused.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import anyio
import redis.asyncio as aredis
from fastapi import APIRouter, HTTPException, Request, Response

from api.deps import JobDep, SettingsDep, StoreDep, TenantDep
from api.schemas import ErrorBody, JobCounts, StorageBytes, Usage
from api.storage.uploads import drain
from pdppo.disk_usage import DiskUsage, measure, remove_job_dir
from pdppo.settings import Settings
from pdppo.store import now_iso, tenant_jobs_key
from pdppo.store.deletion import AsyncDeletion
from pdppo.store.keys import job_key, tenant_usage_key

log = logging.getLogger(__name__)
router = APIRouter(tags=["storage"])
FORM_FRAMING_BYTES = 1024  # as api.routes.files: the part of an upload's body that is not the file
_STATUSES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")
_BATCH = 500

QUOTA_RESPONSE: dict[int | str, dict[str, Any]] = {
    507: {
        "model": ErrorBody,
        "description": (
            "the tenant keeps PDPPO_MAX_STORAGE_BYTES_PER_TENANT bytes or more (uploads and job "
            "artifacts): delete jobs or files first (`GET /v1/usage` shows the bytes)"
        ),
    }
}


async def _job_ids(client: aredis.Redis, tenant: str) -> list[str]:
    return [str(i) for i in await client.zrange(tenant_jobs_key(tenant), 0, -1)]


async def tenant_bytes(
    client: aredis.Redis, settings: Settings, tenant: str, *, fresh: bool = False
) -> tuple[DiskUsage, str]:
    """(the tenant's bytes on disk, when measured): from the cache, or (`fresh`) measured now."""
    key = tenant_usage_key(tenant)
    if not fresh and settings.usage_cache_seconds > 0 and (cached := await client.get(key)):
        data = json.loads(cached)
        return DiskUsage(files=data["files"], artifacts=data["artifacts"]), data["at"]
    ids = await _job_ids(client, tenant)
    usage = await anyio.to_thread.run_sync(measure, settings.artifact_dir, tenant, ids)
    at = now_iso()
    if settings.usage_cache_seconds > 0:
        value = json.dumps({"files": usage.files, "artifacts": usage.artifacts, "at": at})
        await client.set(key, value, px=max(1, int(settings.usage_cache_seconds * 1000)))
    return usage, at


async def forget_usage(client: aredis.Redis, tenant: str) -> None:
    """After a delete or an upload: the next look measures again."""
    await client.delete(tenant_usage_key(tenant))


async def refuse_over_quota(
    client: aredis.Redis,
    settings: Settings,
    tenant: str,
    *,
    incoming: int = 0,
    request: Request | None = None,
) -> None:
    """507 when the tenant is at its storage quota, or `incoming` bytes would take it past it.
    Given the `request` of an upload whose body is not read yet, `incoming` is its declared size
    (less the form's framing), and the body is drained before the 507."""
    quota = settings.max_storage_bytes_per_tenant
    if quota == 0:
        return
    usage, _ = await tenant_bytes(client, settings, tenant)
    if request is not None:
        declared = request.headers.get("content-length", "")
        incoming = max(int(declared) - FORM_FRAMING_BYTES, 1) if declared.isdigit() else 1
    if usage.total + incoming <= quota and usage.total < quota:
        return
    if request is not None:
        await drain(request)
    what = "this upload would pass" if incoming and usage.total < quota else "that is at least"
    raise HTTPException(
        507,
        detail=(
            f"tenant {tenant!r} keeps {usage.total} bytes ({usage.files} of uploaded files, "
            f"{usage.artifacts} of job artifacts); {what} its storage quota of {quota} bytes "
            "(PDPPO_MAX_STORAGE_BYTES_PER_TENANT): delete jobs (pdppo delete ID) or files "
            "(pdppo files delete ID) first"
        ),
    )


@router.delete(
    "/v1/jobs/{job_id}",
    status_code=204,
    response_class=Response,
    responses={
        204: {"description": "the job and everything it kept are gone; a later GET is 404"},
        409: {
            "model": ErrorBody,
            "description": (
                "the job has not ended (cancel it first), its worker is still finishing it "
                "(retry after `Retry-After` seconds), or an active job starts from its final "
                "model (the detail names them)"
            ),
        },
    },
)
async def delete_job(job: JobDep, store: StoreDep, settings: SettingsDep) -> Response:
    """Deletes an ended job: its record, events, metrics, evaluations, samples and its folder of
    artifacts. 409 while it is queued, running or paused, while its worker still holds it, or
    while a queued, running or paused job starts from its final model."""
    deleted = await AsyncDeletion(store.redis).delete_job(job.id, job.tenant)
    if deleted.outcome == "missing":  # deleted by another request in between
        raise HTTPException(404, detail=f"job {job.id!r} not found")
    if deleted.outcome == "active":
        raise HTTPException(
            409,
            detail=(
                f"job {job.id!r} is {deleted.status}; only an ended job can be deleted: cancel it "
                f"first (pdppo cancel {job.id})"
            ),
        )
    if deleted.outcome == "leased":
        raise HTTPException(
            409,
            detail=f"job {job.id!r} has ended but its worker is still finishing it; try again",
            headers={"Retry-After": "5"},
        )
    if deleted.outcome == "used":
        raise HTTPException(
            409,
            detail=(
                f"job {job.id!r} is the model (train.model.name 'job:{job.id}') of active jobs "
                f"{', '.join(deleted.users)}; delete it once they have ended"
            ),
        )
    try:
        await anyio.to_thread.run_sync(remove_job_dir, settings.artifact_dir, job.id)
        await AsyncDeletion(store.redis).purged(job.id)
    except OSError:  # still in the purge set: a worker's retention pass removes it
        log.warning("could not remove the folder of deleted job %s", job.id, exc_info=True)
    await forget_usage(store.redis, job.tenant)
    return Response(status_code=204)


async def _job_counts(client: aredis.Redis, ids: list[str]) -> JobCounts:
    counts = dict.fromkeys(_STATUSES, 0)
    for start in range(0, len(ids), _BATCH):
        pipe = client.pipeline(transaction=False)
        for job_id in ids[start : start + _BATCH]:
            pipe.hget(job_key(job_id), "status")
        for status in await pipe.execute():
            if status in counts:
                counts[status] += 1
    return JobCounts(**counts)


@router.get("/v1/usage", response_model=Usage, responses={200: {"description": "the usage"}})
async def usage(tenant: TenantDep, store: StoreDep, settings: SettingsDep) -> Usage:
    """The caller's jobs by status, its files, the bytes it keeps on disk and its storage quota.
    The bytes are measured now (and kept for the quota checks that follow): whoever asks wants
    what is there after the job that just ended, not what the cache saw before it ran."""
    jobs = await _job_counts(store.redis, await _job_ids(store.redis, tenant))
    files, _ = await store.files.usage(tenant)
    used, at = await tenant_bytes(store.redis, settings, tenant, fresh=True)
    return Usage(
        tenant=tenant,
        jobs=jobs,
        files=files,
        bytes=StorageBytes(files=used.files, artifacts=used.artifacts, total=used.total),
        quota_bytes=settings.max_storage_bytes_per_tenant or None,
        measured_at=datetime.fromisoformat(at),
    )
