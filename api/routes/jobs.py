"""Jobs: submit (and validate without submitting), list, get, cancel.

Admission runs the same checks for `POST /v1/jobs` and `POST /v1/jobs:validate`: the spec's
schema (FastAPI, from `JobSpec`), the local paths it names (`api.paths`), and its budget
(`core.budget`: memory, parameters and tokens against the queue's `PDPPO_MAX_*` limits), so that
one spec cannot take a shared worker down and a client can ask first what a spec would cost.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, HTTPException, Query, Response

from api.convert import to_job
from api.deps import JobDep, PublisherDep, SettingsDep, StoreDep, TenantDep
from api.observability import JOBS_SUBMITTED
from api.paths import forbidden_paths
from api.schemas import (
    BudgetEstimate,
    BudgetLimits,
    ErrorBody,
    Job,
    JobList,
    JobStatus,
    JobValidation,
    SpecProblem,
)
from core.budget import Budget, Limits, check, estimate
from pdppo.files import spec_file_ids
from pdppo.job_models import FIELD as JOB_MODEL_FIELD
from pdppo.job_models import final_model_dir, job_model_problem, source_job_id
from pdppo.settings import Settings
from pdppo.spec import JobSpec
from pdppo.store import AsyncFileStore, AsyncJobStore, spec_digest
from workers.celery_app import revoke_queued

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
_limiter: anyio.CapacityLimiter | None = None


def _broker_limiter() -> anyio.CapacityLimiter:
    """Celery's control calls are blocking, so they run in threads; but dozens of threads fighting
    the event loop for the GIL make the tail latency of every request worse than queueing does.
    Two threads at a time; the other requests wait their turn in the event loop."""
    global _limiter
    if _limiter is None:
        _limiter = anyio.CapacityLimiter(2)
    return _limiter


def _admission(
    spec: JobSpec, settings: Settings, model_dir: Path | None = None
) -> tuple[Budget, Limits, list[SpecProblem]]:
    """The spec's budget on its queue and every reason `POST /v1/jobs` would refuse it.

    A spec whose paths are refused is estimated without reading any file: the API must not
    open what the tenant may not read, not even a header. `model_dir`: the final model a
    `job:<id>` name stands for, once the job is known to be the tenant's own."""
    paths = forbidden_paths(spec, [str(r) for r in settings.allowed_data_roots])
    queue = spec.resources.device
    budget = estimate(
        spec.train,
        queue=queue,
        read_files=not paths,
        data_roots=[str(r) for r in settings.allowed_data_roots],
        model_dir=model_dir,
    )
    limits = settings.budget_limits(queue)
    problems = [SpecProblem(field=p.split(":", 1)[0], kind="path", message=p) for p in paths]
    timeout = spec.resources.timeout_minutes
    if timeout is not None and timeout > settings.max_job_timeout_minutes:
        problems.append(
            SpecProblem(
                field="resources.timeout_minutes",
                kind="timeout",
                message=(
                    f"resources.timeout_minutes: {timeout:g} is more than this server's "
                    f"maximum of {settings.max_job_timeout_minutes:g} minutes"
                ),
            )
        )
    gpus = spec.resources.gpus
    if gpus > settings.max_job_devices:
        problems.append(
            SpecProblem(
                field="resources.gpus",
                kind="devices",
                message=(
                    f"resources.gpus: {gpus} is more devices than this server's workers give a "
                    f"job (PDPPO_MAX_JOB_DEVICES={settings.max_job_devices})"
                ),
            )
        )
    engine = spec.train.rollout.engine
    if engine not in settings.rollout_engines:
        problems.append(
            SpecProblem(
                field="train.rollout.engine",
                kind="engine",
                message=(
                    f"train.rollout.engine: {engine!r} is not offered by this server's workers "
                    f"(they offer {settings.rollout_engines}); vLLM rollouts need the `vllm` "
                    "extra (pip install 'pdppo[vllm]') in the workers, and the API told with "
                    "PDPPO_ROLLOUT_ENGINES"
                ),
            )
        )
    problems += [
        SpecProblem(field=p.field, kind=p.kind, message=str(p), estimate=p.estimate, limit=p.limit)
        for p in check(budget, limits)
    ]
    return budget, limits, problems


async def _admit(
    spec: JobSpec, settings: Settings, tenant: str, store: AsyncJobStore
) -> tuple[Budget, Limits, list[SpecProblem]]:
    """`_admission`, in a worker thread when it may read files (a local model's headers, a
    dataset's prompts), so that a slow disk never stalls the event loop; and the uploaded files
    and the earlier job's model (`job:<id>`) the spec names, which must be the tenant's own."""
    task = spec.train.task
    model_dir, model_problems = await _job_model(spec, settings, tenant, store)
    if spec.train.model.name.startswith("hf:") or task.path or task.validation_path or model_dir:
        budget, limits, problems = await anyio.to_thread.run_sync(
            _admission, spec, settings, model_dir
        )
    else:
        budget, limits, problems = _admission(spec, settings)
    problems = model_problems + problems
    return budget, limits, problems + await _missing_files(spec, tenant, store.files)


async def _job_model(
    spec: JobSpec, settings: Settings, tenant: str, store: AsyncJobStore
) -> tuple[Path | None, list[SpecProblem]]:
    """For `model.name: job:<id>` (`pdppo.job_models`): that job's final-model folder, when it
    is the tenant's own job that succeeded and this API process sees its artifact store (the
    estimate reads it; a worker checks again), or the problem that refuses the spec."""
    name = spec.train.model.name
    source = source_job_id(name)
    if source is None:
        return None, []
    problem = job_model_problem(name, await store.get(source), tenant)
    if problem is not None:
        return None, [SpecProblem(field=JOB_MODEL_FIELD, kind="file", message=problem)]
    folder = final_model_dir(settings.artifact_dir, source)
    return (folder if await anyio.Path(folder).is_dir() else None), []


async def _missing_files(spec: JobSpec, tenant: str, files: AsyncFileStore) -> list[SpecProblem]:
    """A problem per file id of the spec that the tenant has not uploaded (or has deleted)."""
    named = spec_file_ids(spec.train.task)
    if not named:
        return []
    have = await files.existing(tenant, [file_id for _, file_id in named])
    return [
        SpecProblem(
            field=where,
            kind="file",
            message=f"{where}: file {file_id!r} not found; upload it first (POST /v1/files)",
        )
        for where, file_id in named
        if file_id not in have
    ]


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
        503: {"model": ErrorBody, "description": "the job store or the queue is unreachable"},
    },
)
async def create_job(
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

    The job and its outbox entry are one write; the task is published after it, by a thread of
    this process, off the request path. If this process dies in between, or the publish fails,
    the job is still queued and a worker's dispatcher publishes its task within seconds
    (`pdppo.store.outbox`), so a job this returns, new or replayed for an Idempotency-Key, always
    runs: a failed publish is logged, not a 503 and a failed job that every retry with the same
    key would get back."""
    _, _, problems = await _admit(spec, settings, tenant, store)
    if problems:
        raise HTTPException(422, detail="; ".join(p.message for p in problems))
    spec_json = spec.model_dump_json()
    queue = spec.queue
    result = await store.create(
        tenant=tenant,
        queue=queue,
        name=spec.name,
        spec_json=spec_json,
        total_steps=spec.train.steps,
        max_active=settings.max_active_jobs_per_tenant,
        idempotency=idempotency_key,
        idempotency_ttl=settings.idempotency_ttl_seconds,
        dispatch_grace=settings.outbox_grace_seconds,
    )
    if result.outcome == "limit":
        raise HTTPException(
            429,
            detail=(
                f"tenant {tenant!r} has {result.active} queued or running jobs; the limit is "
                f"{settings.max_active_jobs_per_tenant}"
            ),
            headers={"Retry-After": "30"},
        )
    assert result.job_id is not None
    record = result.record or await store.get(result.job_id)
    if record is None:  # only if someone deleted it in between
        raise HTTPException(404, detail=f"job {result.job_id!r} not found")
    if result.outcome == "existing":
        if record.spec_digest != spec_digest(spec_json):
            raise HTTPException(
                409, detail="Idempotency-Key was already used with a different job spec"
            )
        response.headers["Idempotent-Replayed"] = "true"
        return to_job(record)
    if settings.api_publish_tasks:
        publisher.submit(record.id, queue)  # off the request path: see api/publisher.py
    JOBS_SUBMITTED.labels(queue).inc()
    return to_job(record)


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
    budget, limits, problems = await _admit(spec, settings, tenant, store)
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


@router.get("/{job_id}", response_model=Job)
async def get_job(job: JobDep) -> Job:
    return to_job(job)


@router.post("/{job_id}/cancel", status_code=202, response_model=Job)
async def cancel_job(job: JobDep, store: StoreDep) -> Job:
    """202: a queued or paused job is cancelled at once and never starts again; a running one gets
    `cancel_requested: true` and stops within seconds, even in the middle of a step (its worker
    kills it after PDPPO_CANCEL_GRACE_SECONDS if it has not stopped), keeping its checkpoints.
    409 if the job has already finished."""
    outcome = await store.cancel(job.id)
    if outcome == "missing":
        raise HTTPException(404, detail=f"job {job.id!r} not found")
    if outcome.startswith("already-"):
        status = outcome.removeprefix("already-")
        raise HTTPException(409, detail=f"job {job.id!r} already {status}; nothing to cancel")
    if outcome.startswith("cancelled-while-"):
        try:
            await anyio.to_thread.run_sync(revoke_queued, job.id, limiter=_broker_limiter())
        except Exception:  # the task skips a cancelled job by itself anyway
            log.warning("could not revoke the task of job %s", job.id, exc_info=True)
    record = await store.get(job.id)
    return to_job(record or job)
