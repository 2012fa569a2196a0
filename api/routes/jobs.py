"""Jobs: submit (and validate without submitting), list, get, cancel.

`POST /v1/jobs` and `POST /v1/jobs:validate` run the same admission (`api.jobs.admission`), so that
a client can ask first what a spec would cost and whether it would be taken.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response

from api.deps import JobDep, PublisherDep, SettingsDep, StoreDep, TenantDep
from api.jobs.admission import admit
from api.jobs.convert import to_job
from api.jobs.pending_writes import documented_503, idempotent_retry, pending_write
from api.jobs.preconditions import ETAG_HEADER, etag
from api.jobs.revoke import revoke_tasks
from api.jobs.submission import submit
from api.routes.storage import QUOTA_RESPONSE
from api.schemas import (
    BudgetEstimate,
    BudgetLimits,
    ErrorBody,
    Job,
    JobList,
    JobStatus,
    JobValidation,
)
from pdppo.spec import JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "missing or invalid API key"},
    413: {"model": ErrorBody, "description": "request body larger than PDPPO_MAX_BODY_BYTES"},
}


@router.post(
    "",
    status_code=201,
    response_model=Job,
    responses={
        **_ERRORS,
        409: {"model": ErrorBody, "description": "Idempotency-Key reused with another spec"},
        422: {
            "model": ErrorBody,
            "description": (
                "an invalid spec (`errors` lists each field), a local path outside the data "
                "roots, an uploaded file id (train.task.file, train.task.validation_file) the "
                "tenant does not have, or a job over its queue's budget (memory, parameters, "
                "tokens); the detail names the field, the estimate and the limit"
            ),
        },
        429: {"model": ErrorBody, "description": "the tenant's active-job limit is reached"},
        **documented_503(
            "job",
            "the job may have been created, and then it runs (a retry with the same "
            "Idempotency-Key returns it)",
        ),
        **QUOTA_RESPONSE,
    },
)
async def create_job(
    request: Request,
    spec: JobSpec,
    tenant: TenantDep,
    store: StoreDep,
    settings: SettingsDep,
    publisher: PublisherDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=255,
            description="a retry with the same key and spec returns the same job",
        ),
    ] = None,
) -> Job:
    """201 with the new job, queued. 429 past the tenant's limit of queued plus running jobs;
    422 for a spec naming local files outside the server's data roots, or one that would need
    more memory, parameters or tokens than a worker of its queue may give a job
    (`POST /v1/jobs:validate` tells the same without submitting).

    The job is written and queued as `api.jobs.submission` says (the same path as
    `POST /v1/fine_tuning/jobs`): a job this returns always runs."""
    idempotent_retry(request, "returns that job, never a second")
    submitted = await submit(
        request,
        spec,
        tenant,
        store=store,
        settings=settings,
        publisher=publisher,
        idempotency_key=idempotency_key,
    )
    if submitted.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return to_job(submitted.record)


@router.post(
    ":validate",
    response_model=JobValidation,
    responses={
        **_ERRORS,
        200: {
            "description": (
                "the estimate, the queue's limits and every problem `POST /v1/jobs` would "
                "refuse the spec for (`ok: false`), or none (`ok: true`)"
            )
        },
        422: {
            "model": ErrorBody,
            "description": "not a valid job spec (`errors` lists each field); nothing to estimate",
        },
    },
)
async def validate_job(
    spec: JobSpec, tenant: TenantDep, settings: SettingsDep, store: StoreDep
) -> JobValidation:
    """What the job would cost and whether `POST /v1/jobs` would take it, without creating or
    queueing anything: the same path and budget checks, answered as data (200) instead of a
    422, so that a client can size a spec before submitting it (`pdppo submit --dry-run`)."""
    budget, limits, problems = await admit(spec, settings, tenant, store)
    return JobValidation(
        ok=not problems,
        estimate=BudgetEstimate.model_validate(budget.to_dict()),
        limits=BudgetLimits.model_validate(limits, from_attributes=True),
        problems=problems,
    )


@router.get("", response_model=JobList)
async def list_jobs(
    tenant: TenantDep,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=100, description="page size")] = 20,
    cursor: Annotated[
        str | None, Query(pattern=r"^[0-9a-f]{24}$", description="next_cursor of the last page")
    ] = None,
    status: Annotated[JobStatus | None, Query(description="only jobs in this status")] = None,
) -> JobList:
    """The caller's own jobs, newest first."""
    records, next_cursor = await store.list_jobs(tenant, limit=limit, cursor=cursor, status=status)
    return JobList(items=[to_job(r) for r in records], next_cursor=next_cursor)


@router.get(
    "/{job_id}",
    response_model=Job,
    responses={200: {"description": "the job", "headers": ETAG_HEADER}},
)
async def get_job(job: JobDep, response: Response) -> Job:
    """The job; its `ETag` is its config_version, the `If-Match` of a change
    (`PATCH /v1/jobs/{id}`)."""
    response.headers["ETag"] = etag(job.config_version)
    return to_job(job)


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=Job,
    responses=documented_503("job", "the cancel may still take effect"),
)
async def cancel_job(request: Request, job: JobDep, store: StoreDep) -> Job:
    """202: a queued or paused job is cancelled at once and never starts again; a running one gets
    `cancel_requested: true` and stops within seconds, even in the middle of a step (its worker
    kills it after PDPPO_CANCEL_GRACE_SECONDS if it has not stopped), keeping its checkpoints.
    409 if the job has already finished."""
    pending_write(request, "job", job.id, f"the cancel of job {job.id}")
    outcome = await store.cancel(job.id)
    if outcome == "missing":
        raise HTTPException(404, detail=f"job {job.id!r} not found")
    if outcome.startswith("already-"):
        status = outcome.removeprefix("already-")
        raise HTTPException(409, detail=f"job {job.id!r} already {status}; nothing to cancel")
    if outcome.startswith("cancelled-while-"):
        await revoke_tasks([job.id])
    record = await store.get(job.id)
    return to_job(record or job)
