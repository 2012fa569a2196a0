"""`/v1/fine_tuning/...`: OpenAI's fine-tuning jobs and graders, translated onto pdppo's.

Each route reads OpenAI's request, does what the native route does (mostly by calling it), and
answers OpenAI's object. Pagination runs OpenAI's way: newest first, `after` the last id of the
previous page, `has_more`.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, Response

from api.deps import PublisherDep, SettingsDep, StoreDep, TenantDep, get_owned_job
from api.jobs.submission import SpecRefused, submit
from api.openai.grading import GraderRunsDep, admit_run, grader_for
from api.openai.grading import run_grader as grade_one
from api.openai.schemas import (
    CheckpointMetrics,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobCheckpointList,
    FineTuningJobCreate,
    FineTuningJobEventList,
    FineTuningJobList,
    GraderRunMetadata,
    GraderRunRequest,
    GraderRunResponse,
    GraderValidateRequest,
    GraderValidateResponse,
    OpenAIErrorBody,
)
from api.openai.translate import (
    EVENT_PREFIX,
    JOB_PREFIX,
    Refused,
    job_id_of,
    problem_param,
    to_event,
    to_openai_job,
    to_spec,
)
from api.routes.artifacts import list_checkpoints
from api.routes.jobs import cancel_job
from api.routes.steering import pause_job, resume_job
from pdppo.store import JobRecord
from pdppo.store.jobs.events import EventIdError, parse_event_id
from pdppo.store.keys import idempotency_key as stored_key

router = APIRouter(prefix="/v1/fine_tuning", tags=["openai"])
_ERROR: dict[str, Any] = {"model": OpenAIErrorBody}


async def get_openai_job(
    fine_tuning_job_id: Annotated[
        str, Path(description="ftjob-<id> (or the native id)", max_length=70)
    ],
    tenant: TenantDep,
    store: StoreDep,
) -> JobRecord:
    """The caller's job by its OpenAI id: the same lookup (and 404) as the native routes'."""
    return await get_owned_job(job_id_of(fine_tuning_job_id), tenant, store)


OpenAIJobDep = Annotated[JobRecord, Depends(get_openai_job)]


@router.post(
    "/jobs",
    response_model=FineTuningJob,
    status_code=200,
    responses={
        400: {**_ERROR, "description": "a request pdppo cannot run; `param` names the field"},
        409: {**_ERROR, "description": "Idempotency-Key reused with another request"},
        429: {**_ERROR, "description": "the tenant's active-job limit is reached"},
        503: {**_ERROR, "description": "the job store is unreachable; the job may exist"},
        507: {**_ERROR, "description": "the tenant's storage quota is full"},
    },
)
async def create_fine_tuning_job(
    request: Request,
    body: FineTuningJobCreate,
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
            description="a retry with the same key and request returns the same job",
        ),
    ] = None,
) -> FineTuningJob:
    """A reinforcement fine-tuning job, translated into a pdppo job spec
    (`api.openai.translate`) and submitted as `POST /v1/jobs` submits it; 200 with the job, as
    OpenAI answers. A retry of a create (same Idempotency-Key, or the SDK's own retry) is
    answered with its job before anything that would refuse a new one, the training file's
    lookup included (`api.jobs.submission`)."""
    asked = body.model_dump(mode="json", exclude_none=True)
    ttl = settings.idempotency_ttl_seconds
    if idempotency_key is None:
        idempotency_key = await _sdk_retry_key(request, store, tenant, {"request": asked})
        ttl = SDK_RETRY_WINDOW_SECONDS
    if idempotency_key is not None:
        known = await store.idempotent_job(tenant, idempotency_key)
        if known is not None and known.openai is not None and known.openai["request"] == asked:
            response.headers["Idempotent-Replayed"] = "true"
            return to_openai_job(known)
    records = None
    if body.training_file is not None:
        training = await store.files.get(tenant, body.training_file)
        if training is None:
            raise Refused(
                f"training_file: file {body.training_file!r} not found; upload it first "
                "(client.files.create)",
                "training_file",
            )
        records = training.records
    spec, resolved = to_spec(body, records)
    made = {"request": asked, "hyperparameters": resolved}
    try:
        submitted = await submit(
            request,
            spec,
            tenant,
            store=store,
            settings=settings.model_copy(update={"idempotency_ttl_seconds": ttl}),
            publisher=publisher,
            idempotency_key=idempotency_key,
            openai_json=json.dumps(made),
            metadata=body.metadata,
        )
    except SpecRefused as refused:  # admission: paths, files, budget, graders
        raise Refused(str(refused.detail), problem_param(refused.problems[0].field)) from None
    if submitted.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return to_openai_job(submitted.record)


SDK_RETRY_WINDOW_SECONDS = 300
"""How long a create answers an SDK retry of itself with the job it made: the SDK's retries
come within seconds (two, backing off up to 8 s)."""


async def _sdk_retry_key(
    request: Request, store: StoreDep, tenant: str, made: dict[str, Any]
) -> str | None:
    """An idempotency key for the `openai` SDK's own retries, which send none: the SDK numbers
    each attempt (`x-stainless-retry-count`). A first attempt (0) always creates a job, and
    claims the key its request's digest makes; a retry (1, 2) of the same request within
    SDK_RETRY_WINDOW_SECONDS gets that job back, so a create whose answer was lost (a timeout,
    a 503 after the write) never makes a second job. Other clients pass Idempotency-Key."""
    attempt = request.headers.get("x-stainless-retry-count")
    if attempt is None or not attempt.isdigit():
        return None
    digest = hashlib.sha256(json.dumps(made["request"]).encode()).hexdigest()
    key = f"openai-sdk-{digest}"
    if attempt == "0":
        await store.redis.delete(stored_key(tenant, key))
    return key


@router.get("/jobs", response_model=FineTuningJobList)
async def list_fine_tuning_jobs(
    request: Request,
    tenant: TenantDep,
    store: StoreDep,
    after: Annotated[str | None, Query(max_length=70, description="the last id of a page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> FineTuningJobList:
    """The tenant's jobs (made here or with `POST /v1/jobs`), newest first. `metadata[k]=v`
    query parameters keep the jobs whose metadata has each, read from the metadata index
    (`pdppo.store.metadata`) rather than from all the tenant's jobs: bench/
    openai_list_metadata.py, 10,000 jobs, ~325 ms a filtered listing by that scan."""
    wanted = {
        key[len("metadata[") : -1]: value
        for key, value in request.query_params.items()
        if key.startswith("metadata[") and key.endswith("]")
    }
    cursor = job_id_of(after) if after else None
    if wanted:  # the jobs with those pairs, from their index (`pdppo.store.metadata`)
        found, has_more = await store.metadata.jobs(tenant, wanted, cursor=cursor, limit=limit)
    else:
        found, next_cursor = await store.list_jobs(tenant, limit=limit, cursor=cursor, status=None)
        has_more = next_cursor is not None
    return FineTuningJobList(data=[to_openai_job(r) for r in found], has_more=has_more)


@router.get("/jobs/{fine_tuning_job_id}", response_model=FineTuningJob)
async def retrieve_fine_tuning_job(job: OpenAIJobDep) -> FineTuningJob:
    return to_openai_job(job)


_STEER: dict[int | str, dict[str, Any]] = {
    409: {**_ERROR, "description": "the job is not in a state that allows it"},
    503: {**_ERROR, "description": "the job store is unreachable; it may still take effect"},
}


@router.post("/jobs/{fine_tuning_job_id}/cancel", response_model=FineTuningJob, responses=_STEER)
async def cancel_fine_tuning_job(
    request: Request, job: OpenAIJobDep, store: StoreDep
) -> FineTuningJob:
    """What `POST /v1/jobs/{id}/cancel` does; 200 with the job (a running one is `cancelled`
    within seconds)."""
    await cancel_job(request, job, store)
    return await _current(store, job)


@router.post("/jobs/{fine_tuning_job_id}/pause", response_model=FineTuningJob, responses=_STEER)
async def pause_fine_tuning_job(
    request: Request, job: OpenAIJobDep, store: StoreDep
) -> FineTuningJob:
    """What `POST /v1/jobs/{id}/pause` does: a running job checkpoints and becomes `paused`."""
    await pause_job(request, job, store)
    return await _current(store, job)


@router.post(
    "/jobs/{fine_tuning_job_id}/resume",
    response_model=FineTuningJob,
    responses={**_STEER, 429: {**_ERROR, "description": "the active-job limit is reached"}},
)
async def resume_fine_tuning_job(
    request: Request,
    job: OpenAIJobDep,
    store: StoreDep,
    settings: SettingsDep,
    publisher: PublisherDep,
) -> FineTuningJob:
    """What `POST /v1/jobs/{id}/resume` does: queued again, from its checkpoint."""
    answered = await resume_job(request, job, store, settings, publisher)
    current = await _current(store, job)
    # the native answer is the job as the resume left it, before a worker could claim it
    return current.model_copy(update={"status": answered.status})


async def _current(store: StoreDep, job: JobRecord) -> FineTuningJob:
    return to_openai_job(await store.get(job.id) or job)


def _after(after: str | None, prefix: str) -> tuple[int, int] | None:
    if not after:
        return None
    try:
        return parse_event_id(after.removeprefix(prefix))
    except EventIdError as exc:
        raise HTTPException(400, detail=f"after: {exc}") from None


@router.get(
    "/jobs/{fine_tuning_job_id}/events",
    response_model=FineTuningJobEventList,
    responses={400: {**_ERROR, "description": "`after` is not an event id"}},
)
async def list_fine_tuning_events(
    job: OpenAIJobDep,
    store: StoreDep,
    after: Annotated[
        str | None,
        Query(pattern=r"^ftevent-\d{1,20}-\d{1,20}$", description="the last id of a page"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> FineTuningJobEventList:
    """The job's events, newest first: `metrics` events for each step and evaluation (their
    `data` holds the numbers), `message` events for the rest."""
    entries = await store.events.entries_before(job.id, _after(after, EVENT_PREFIX), limit + 1)
    return FineTuningJobEventList(
        data=[to_event(entry_id, fields) for entry_id, fields in entries[:limit]],
        has_more=len(entries) > limit,
    )


@router.get("/jobs/{fine_tuning_job_id}/checkpoints", response_model=FineTuningJobCheckpointList)
async def list_fine_tuning_checkpoints(
    job: OpenAIJobDep,
    store: StoreDep,
    settings: SettingsDep,
    after: Annotated[str | None, Query(max_length=120, description="the last id of a page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> FineTuningJobCheckpointList:
    """The checkpoints on disk (the trainer keeps the latest few), newest first, each with the
    metrics of its step."""
    native = await list_checkpoints(job, settings)
    by_step = {row["step"]: row.get("metrics", {}) for row in await store.metrics_history(job.id)}
    items = [
        FineTuningJobCheckpoint(
            id=f"ftckpt-{job.id}-{c.step}",
            created_at=int(c.created_at.timestamp()),
            fine_tuned_model_checkpoint=c.download_url,
            fine_tuning_job_id=JOB_PREFIX + job.id,
            metrics=CheckpointMetrics.model_validate(
                {"step": float(c.step), **by_step.get(c.step, {})}
            ),
            step_number=c.step,
        )
        for c in reversed(native.items)
    ]
    if after:
        ids = [c.id for c in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return FineTuningJobCheckpointList(
        data=page,
        has_more=len(items) > limit,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
    )


@router.post(
    "/alpha/graders/validate",
    response_model=GraderValidateResponse,
    responses={400: {**_ERROR, "description": "not a grader this service runs; `param` says"}},
)
async def validate_grader(
    body: GraderValidateRequest, tenant: TenantDep, settings: SettingsDep
) -> GraderValidateResponse:
    """The grader as it will run (200), or why not (400): the same checks as a job's. Like
    every /v1 call, for holders of an API key only (`tenant` is the check)."""
    grader_for(body.grader, settings.grader_options())
    return GraderValidateResponse(grader=body.grader.model_dump(mode="json", exclude_none=True))


@router.post(
    "/alpha/graders/run",
    response_model=GraderRunResponse,
    responses={
        400: {
            **_ERROR,
            "description": (
                "not a grader this service runs, or a python grader whose top level raised, "
                "exited or did not finish loading in PDPPO_OPENAI_PYTHON_LOAD_SECONDS; `param` "
                "says which"
            ),
        },
        429: {
            **_ERROR,
            "description": (
                "too many grader runs in flight, the tenant's (PDPPO_GRADER_RUNS_MAX_PER_TENANT) "
                "or this server's (PDPPO_GRADER_RUNS_MAX); Retry-After says when to try again"
            ),
        },
        501: {**_ERROR, "description": "a similarity metric whose library is not installed"},
    },
)
async def run_grader(
    body: GraderRunRequest, tenant: TenantDep, settings: SettingsDep, runs: GraderRunsDep
) -> GraderRunResponse:
    """The grader's score for one sample and item, as a job would score it (`api.openai.
    grading`: a python grader in a grading server of its own, the others in a thread here)."""
    options = settings.grader_options()
    grader = grader_for(body.grader, options)
    slot = admit_run(runs, tenant)
    started = time.monotonic()
    try:
        result = await grade_one(body.grader, grader, options, body.model_sample, body.item or {})
    finally:
        slot.release()
    reward, parts, errors, message = result.reward, result.parts, result.errors, result.message
    return GraderRunResponse(
        reward=reward,
        sub_rewards=dict(parts),
        metadata=GraderRunMetadata(
            errors=errors,
            execution_time=time.monotonic() - started,
            name=body.grader.name,
            scores={**parts, **({"error": message} if message else {})},
            type=body.grader.type,
        ),
    )
