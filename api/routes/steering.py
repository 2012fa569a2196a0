"""Steering a job: `PATCH /v1/jobs/{id}` changes its settings while it runs; pause and resume.

A change is a JSON merge patch (RFC 7396) of the job spec, limited to what the trainer may change
between steps (`core.training.steering.STEERABLE`), validated like a submitted spec (the schema,
then the same admission as `POST /v1/jobs`: a longer run must still fit its queue's token budget),
stored as the job's cumulative `overrides` and applied by the job at its next step boundary, which
says so with a `config` event. The store script compares the version the change was computed from,
so two clients changing a job at once never undo each other; and, given `If-Match`, the version the
client computed its change from (`api.jobs.preconditions`), so a retry of a change that landed is
refused (412), not made twice.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

from fastapi import APIRouter, Body, Header, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.deps import JobDep, PublisherDep, SettingsDep, StoreDep, TenantDep
from api.jobs.admission import admit
from api.jobs.convert import to_job
from api.jobs.pending_writes import documented_503, pending_write
from api.jobs.preconditions import (
    ETAG_HEADER,
    PRECONDITION_RESPONSE,
    etag,
    if_match_versions,
    mismatch_detail,
)
from api.schemas import ErrorBody, Job, VersionMismatchBody
from core.training.steering import STEERABLE, SteeringError, check_change, leaves, merge_patch
from pdppo.settings import Settings
from pdppo.spec import JobSpec
from pdppo.store import JobRecord
from workers.celery_app import task_priority

router = APIRouter(prefix="/v1/jobs", tags=["steering"])
CONFLICT_RETRIES = 5


class JobPatch(BaseModel):
    """A JSON merge patch (RFC 7396) of a job spec; only `train` settings may change."""

    model_config = ConfigDict(extra="forbid", strict=True)

    train: dict[str, Any] = Field(
        min_length=1,
        description=(
            "the train settings to change, nested as in the spec, e.g. "
            '{"optim": {"lr": 0.0001}}; these may change: '
            + ", ".join(STEERABLE)
            + " (kl_beta only in a job that started with one); anything else is a 422"
        ),
        examples=[{"optim": {"lr": 0.0001}, "algorithm": {"delta_high": 0.2}}],
    )


_GONE: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or invalid API key"},
    404: {"model": ErrorBody, "description": "no such job (or another tenant's)"},
    503: {"model": ErrorBody, "description": "the job store is unreachable"},
}


@router.patch(
    "/{job_id}",
    response_model=Job,
    responses={
        **_GONE,
        **documented_503(
            "job",
            "the change may still be made (a retry with the same If-Match is then a 412, not "
            "a second change)",
        ),
        200: {"description": "the job, changed", "headers": ETAG_HEADER},
        409: {"model": ErrorBody, "description": "the job has finished; nothing to change"},
        **PRECONDITION_RESPONSE,
        413: {"model": ErrorBody, "description": "request body larger than PDPPO_MAX_BODY_BYTES"},
        422: {
            "model": ErrorBody,
            "description": (
                "a field that may not change while a job runs, a null, a value the spec's "
                "schema refuses, steps below the job's current step, or a changed job over its "
                "queue's budget; `errors` names each field"
            ),
        },
    },
)
async def patch_job(
    request: Request,
    job: JobDep,
    tenant: TenantDep,
    store: StoreDep,
    settings: SettingsDep,
    response: Response,
    change: Annotated[JobPatch, Body(media_type="application/merge-patch+json")],
    if_match: Annotated[
        str | None,
        Header(
            alias="If-Match",
            max_length=1024,
            description=(
                'the job\'s ETag (its config_version, quoted: "3") the change was computed '
                "from: the change is made only over that version, else 412. Send it on a "
                "retry, so that a change whose answer was lost is not made twice"
            ),
        ),
    ] = None,
) -> Job | JSONResponse:
    """200 with the job and its new `config_version` (and `ETag`). The job applies the change
    at its next step boundary (a queued or paused job when it starts) and announces it with a
    `config` event; `lr` and the mask's thresholds are in every step's metrics. The change is
    kept in the job's checkpoints, so a resumed job keeps it."""
    expected = if_match_versions(if_match)
    for _ in range(CONFLICT_RETRIES):
        overrides, total = await _checked(job, change.train, tenant, store, settings)
        paths = ", ".join(f"train.{p}={v!r}" for p, v in leaves(change.train).items())
        message = (
            f"config change {job.config_version + 1} requested ({paths}); it applies at the "
            "job's next step"
        )
        pending_write(request, "job", job.id, f"the change of job {job.id}")
        outcome, value = await store.steering.patch(
            job.id, job.config_version, overrides, total, message, expected_versions=expected
        )
        if outcome == "patched":
            response.headers["ETag"] = etag(int(value))
            record = await store.get(job.id)
            return to_job(record or job)
        if outcome == "precondition":
            body = VersionMismatchBody(
                detail=mismatch_detail(job.id, int(value), str(if_match)),
                config_version=int(value),
            )
            return JSONResponse(body.model_dump(), 412, headers={"ETag": etag(int(value))})
        if outcome == "terminal":
            raise HTTPException(409, detail=f"job {job.id!r} already {value}; nothing to change")
        fresh = await store.get(job.id)
        if outcome == "missing" or fresh is None:
            raise HTTPException(404, detail=f"job {job.id!r} not found")
        job = fresh  # another change landed first: check ours again over it
    raise HTTPException(409, detail=f"job {job.id!r} is being changed by another client; retry")


async def _checked(
    job: JobRecord, patch: dict[str, Any], tenant: str, store: StoreDep, settings: SettingsDep
) -> tuple[dict[str, Any], int | None]:
    """The job's cumulative overrides with `patch` (of `train`) merged in, and its new step
    count (None: unchanged); a 422 naming the field for a change that may not be made."""
    start = JobSpec.model_validate_json(job.spec_json)
    try:
        check_change(patch, start.train)
    except SteeringError as exc:
        _refuse(["train", *exc.field.split(".")], exc.reason)
    overrides = merge_patch(job.overrides, {"train": patch})
    try:
        spec = JobSpec.model_validate_json(json.dumps(merge_patch(job.spec, overrides)))
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None
    steps = patch.get("steps")
    if steps is not None and steps < job.step:
        _refuse(
            ["train", "steps"],
            f"the job is already at step {job.step}; give at least that many steps",
        )
    _, _, problems = await admit(spec, settings, tenant, store)
    if problems:
        errors = [
            {"loc": ("body", *p.field.split(".")), "msg": p.message, "type": p.kind}
            for p in problems
        ]
        raise RequestValidationError(errors)
    return overrides, steps


def _refuse(loc: list[str], message: str) -> NoReturn:
    raise RequestValidationError(
        [{"loc": ("body", *loc), "msg": message, "type": "value_error.steering"}]
    )


@router.post(
    "/{job_id}/pause",
    status_code=202,
    response_model=Job,
    responses={
        **_GONE,
        **documented_503("job", "the pause may still take effect"),
        409: {"model": ErrorBody, "description": "the job has finished, or a cancel is pending"},
    },
)
async def pause_job(request: Request, job: JobDep, store: StoreDep) -> Job:
    """202: a queued job is paused at once; a running one gets `pause_requested: true`, writes
    a checkpoint within seconds (at its next token or minibatch) and becomes `paused`, holding no
    worker. Pausing a paused job changes nothing. A paused job still counts among the tenant's
    active jobs."""
    pending_write(request, "job", job.id, f"the pause of job {job.id}")
    outcome, record = await store.steering.pause(job.id)
    if outcome == "missing":
        raise HTTPException(404, detail=f"job {job.id!r} not found")
    if outcome == "cancelling":
        raise HTTPException(409, detail=f"job {job.id!r} is being cancelled; nothing to pause")
    if outcome.startswith("already-") and outcome != "already-paused":
        status = outcome.removeprefix("already-")
        raise HTTPException(409, detail=f"job {job.id!r} already {status}; nothing to pause")
    return to_job(record or job)  # as the pause left it: a worker may carry it out meanwhile


@router.post(
    "/{job_id}/resume",
    status_code=202,
    response_model=Job,
    responses={
        **_GONE,
        **documented_503("job", "the resume may still take effect"),
        409: {
            "model": ErrorBody,
            "description": (
                "the job is neither paused nor pausing, nor failed for its disk (storage_full, "
                "storage_error) with its checkpoints kept (retention may have deleted them)"
            ),
        },
        429: {
            "model": ErrorBody,
            "description": (
                "a job failed for its disk, and the tenant has PDPPO_MAX_ACTIVE_JOBS_PER_TENANT "
                "queued, running or paused jobs"
            ),
        },
    },
)
async def resume_job(
    request: Request, job: JobDep, store: StoreDep, settings: SettingsDep, publisher: PublisherDep
) -> Job:
    """202: a paused job is queued again and continues from its checkpoint, at the step after
    it, with no step lost or repeated; a pause not carried out yet is called off. A job that
    failed for its disk (`storage_full`, `storage_error`) is queued again the same way, from its
    latest checkpoint, once space is back."""
    pending_write(request, "job", job.id, f"the resume of job {job.id}")
    outcome = await store.steering.resume(
        job.id, settings.outbox_grace_seconds, job.tenant, settings.max_active_jobs_per_tenant
    )
    if outcome == "missing":
        raise HTTPException(404, detail=f"job {job.id!r} not found")
    if outcome == "limit":
        raise HTTPException(429, detail=_resume_limit(job.tenant, settings))
    if outcome == "expired":
        detail = f"job {job.id!r} failed for its disk, and retention has deleted its checkpoints"
        raise HTTPException(409, detail=f"{detail} since (PDPPO_RETENTION_DAYS): submit it again")
    if outcome.startswith("already-"):
        status = outcome.removeprefix("already-")
        raise HTTPException(409, detail=f"job {job.id!r} is {status}, not paused")
    # read before publishing: a worker may claim the job as soon as its task is out, and the
    # answer is the state this resume made, not the one a fast worker makes next
    record = await store.get(job.id)
    if outcome == "queued" and settings.api_publish_tasks:
        # and the outbox, should this process die first
        publisher.submit(job.id, job.queue, task_priority(job.experiment))
    return to_job(record or job)


def _resume_limit(tenant: str, settings: Settings) -> str:
    return (
        f"tenant {tenant!r} has {settings.max_active_jobs_per_tenant} queued, running or paused "
        "jobs (PDPPO_MAX_ACTIVE_JOBS_PER_TENANT): resume this one once one of them ends"
    )
