"""Experiments: a grid of job specs run over paired seeds, created, followed, reported on and
cancelled, paused, resumed and deleted as one (`api.experiments.children`; the statistics:
`core.experiments`).

Acting on an experiment acts on each child job through the same store calls as the job routes
(`/v1/jobs/{id}/cancel`, `/pause`, `/resume`, `DELETE`), skipping children it does not apply to
(cancelling an experiment whose children partly ended cancels the rest)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Body, Depends, Header, HTTPException, Path, Query, Request, Response

import core.experiments as experiments
from api.deps import PublisherDep, SettingsDep, StoreDep, TenantDep
from api.experiments import children as ops
from api.experiments.schemas import (
    Experiment,
    ExperimentCurves,
    ExperimentList,
    ExperimentReport,
)
from api.jobs.pending_writes import documented_503, idempotent_retry
from api.jobs.revoke import revoke_tasks
from api.routes.storage import QUOTA_RESPONSE, forget_usage
from api.schemas import ErrorBody
from core.experiments import ExperimentSpec
from pdppo.disk_usage import remove_job_dir
from pdppo.store.deletion import AsyncDeletion
from pdppo.store.experiments import ExperimentRecord
from workers.celery_app import task_priority

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])
ID_PATTERN = r"^[0-9a-f]{24}$"
EXAMPLE = {
    "name": "masks",
    "base": {
        "resources": {"device": "cpu"},
        "train": {
            "model": {"name": "builtin:tiny"},
            "task": {"name": "reverse", "min_len": 2, "max_len": 3},
            "steps": 8,
        },
    },
    "grid": {"algorithm.mask": ["predictive", "dppo"]},
    "seeds": 2,
}
# what a retry of a create that answered 503 does (in its OpenAPI description and its detail)
RETRY_OUTCOME = "returns the experiment and makes its missing children, never a second of any"
_404: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such experiment (or another tenant's)"}
}


async def get_owned_experiment(
    experiment_id: Annotated[
        str, Path(description="the experiment id", pattern=ID_PATTERN, max_length=24)
    ],
    tenant: TenantDep,
    store: StoreDep,
) -> ExperimentRecord:
    """The caller's experiment; another tenant's is not found (its keys are per tenant)."""
    record = await store.experiments.get(tenant, experiment_id)
    if record is None:
        raise HTTPException(404, detail=f"experiment {experiment_id!r} not found")
    return record


ExperimentDep = Annotated[ExperimentRecord, Depends(get_owned_experiment)]


async def _view(store: StoreDep, record: ExperimentRecord) -> Experiment:
    return ops.to_experiment(record, await ops.child_jobs(store, record))


@router.post(
    "",
    status_code=201,
    response_model=Experiment,
    responses={
        409: {"model": ErrorBody, "description": "Idempotency-Key reused with another spec"},
        422: {
            "model": ErrorBody,
            "description": (
                "an invalid experiment spec (a grid path that names no field of train, too "
                "many arms, a baseline that is no arm), or a child job spec that POST /v1/jobs "
                "would refuse: the detail names its arm and seed. No job is created"
            ),
        },
        429: {
            "model": ErrorBody,
            "description": (
                "the children would take the tenant past its limit of queued, running or "
                "paused jobs (PDPPO_MAX_ACTIVE_JOBS_PER_TENANT); nothing is created (if another "
                "request took the last places meanwhile, the children made so far are kept: a "
                "retry with the same Idempotency-Key makes the rest)"
            ),
        },
        **documented_503(
            ("experiment", "job"),
            "the experiment (before its first child) or that child may have been created; a "
            "retry with the same Idempotency-Key " + RETRY_OUTCOME,
        ),
        **QUOTA_RESPONSE,
    },
)
async def create_experiment(
    request: Request,
    spec: Annotated[ExperimentSpec, Body(examples=[EXAMPLE])],
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
            description="a retry with the same key and spec returns the same experiment",
        ),
    ] = None,
) -> Experiment:
    """201 with the experiment and its child jobs, one per (arm, seed), queued seed-major. Each
    child is checked as `POST /v1/jobs` checks a job, all before the first is created. The
    experiment takes turns with the tenant's plain jobs and other experiments (and tenants with
    each other), so it never holds up the tenant's other work, nor waits behind it."""
    idempotent_retry(request, RETRY_OUTCOME)
    record, replayed = await ops.create(
        request,
        spec,
        tenant,
        store=store,
        settings=settings,
        publisher=publisher,
        idempotency_key=idempotency_key,
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return await _view(store, record)


@router.get("", response_model=ExperimentList)
async def list_experiments(
    tenant: TenantDep,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=100, description="page size")] = 20,
    cursor: Annotated[
        str | None, Query(pattern=ID_PATTERN, description="next_cursor of the last page")
    ] = None,
) -> ExperimentList:
    """The caller's own experiments, newest first."""
    records, next_cursor = await store.experiments.list(tenant, limit=limit, cursor=cursor)
    return ExperimentList(items=[await _view(store, r) for r in records], next_cursor=next_cursor)


@router.get("/{experiment_id}", response_model=Experiment, responses=_404)
async def get_experiment(record: ExperimentDep, store: StoreDep) -> Experiment:
    """Each arm's runs: seed, child job, status and progress."""
    return await _view(store, record)


@router.post(
    "/{experiment_id}/cancel",
    status_code=202,
    response_model=Experiment,
    responses=_404,
)
async def cancel_experiment(record: ExperimentDep, store: StoreDep) -> Experiment:
    """202: every child not ended yet is cancelled as `POST /v1/jobs/{id}/cancel` does (a queued
    or paused one at once, its task revoked, a running one within seconds); ended children are
    left as they are."""
    revoked: list[str] = []
    for _, _, job_id in record.ordered_runs():
        outcome = await store.cancel(job_id)  # 'already-<status>', 'missing': ended, gone
        if outcome.startswith("cancelled-while-"):
            revoked.append(job_id)
    await revoke_tasks(revoked)
    return await _view(store, record)


@router.post(
    "/{experiment_id}/pause",
    status_code=202,
    response_model=Experiment,
    responses=_404,
)
async def pause_experiment(record: ExperimentDep, store: StoreDep) -> Experiment:
    """202: every queued or running child is paused as `POST /v1/jobs/{id}/pause` does."""
    for _, _, job_id in record.ordered_runs():
        await store.steering.pause(job_id)  # an ended or cancelling child is left alone
    return await _view(store, record)


@router.post(
    "/{experiment_id}/resume",
    status_code=202,
    response_model=Experiment,
    responses={
        **_404,
        429: {
            "model": ErrorBody,
            "description": (
                "some paused children could not be resumed: the tenant is at its limit of "
                "active jobs (the others were)"
            ),
        },
    },
)
async def resume_experiment(
    record: ExperimentDep, store: StoreDep, settings: SettingsDep, publisher: PublisherDep
) -> Experiment:
    """202: every paused child is queued again, in seed-major order, and continues from its
    checkpoint, as `POST /v1/jobs/{id}/resume` does."""
    jobs = await ops.child_jobs(store, record)
    refused = 0
    for _, _, job_id in record.ordered_runs():
        job = jobs.get(job_id)
        if job is None or (job.status != "paused" and not job.pause_requested):
            continue
        outcome = await store.steering.resume(
            job_id, settings.outbox_grace_seconds, job.tenant, settings.max_active_jobs_per_tenant
        )
        refused += outcome == "limit"
        if outcome == "queued" and settings.api_publish_tasks:
            publisher.submit(job_id, job.queue, task_priority(record.id))
    if refused:
        raise HTTPException(
            429,
            detail=(
                f"{refused} paused children of experiment {record.id!r} stay paused: the tenant "
                "is at PDPPO_MAX_ACTIVE_JOBS_PER_TENANT; resume again once jobs have ended"
            ),
            headers={"Retry-After": "30"},
        )
    return await _view(store, record)


@router.delete(
    "/{experiment_id}",
    status_code=204,
    response_class=Response,
    responses={
        **_404,
        204: {"description": "the experiment and every child job are gone"},
        409: {
            "model": ErrorBody,
            "description": "a child has not ended (cancel the experiment first): nothing deleted",
        },
    },
)
async def delete_experiment(
    record: ExperimentDep, store: StoreDep, settings: SettingsDep
) -> Response:
    """Deletes the experiment and its children as `DELETE /v1/jobs/{id}` deletes a job, once all
    have ended; 409, deleting nothing, while any is queued, running or paused."""
    jobs = await ops.child_jobs(store, record)
    active = [j.id for j in jobs.values() if not j.terminal]
    if active:
        raise HTTPException(
            409,
            detail=(
                f"experiment {record.id!r} has {len(active)} children not ended "
                f"({', '.join(active[:4])}); cancel it first (pdppo experiments cancel {record.id})"
            ),
        )
    deletion = AsyncDeletion(store.redis)
    for job_id in jobs:
        deleted = await deletion.delete_job(job_id, record.tenant)
        if deleted.outcome in ("active", "leased", "used"):
            raise HTTPException(
                409,
                detail=f"child job {job_id!r} cannot be deleted yet ({deleted.outcome}); try again",
                headers={"Retry-After": "5"},
            )
        try:
            await anyio.to_thread.run_sync(remove_job_dir, settings.artifact_dir, job_id)
            await deletion.purged(job_id)
        except OSError:  # left in the purge set: retention removes it
            pass
    await store.experiments.delete(record.tenant, record.id)
    await forget_usage(store.redis, record.tenant)
    return Response(status_code=204)


@router.get(
    "/{experiment_id}/report",
    response_model=ExperimentReport,
    responses={
        **_404,
        200: {"content": {"text/csv": {}}},
        422: {"model": ErrorBody, "description": "a metric no child reported, or no such arm"},
    },
)
async def experiment_report(
    record: ExperimentDep,
    store: StoreDep,
    metric: Annotated[str, Query(max_length=200, description="the metric compared")] = (
        "reward_mean"
    ),
    baseline: Annotated[
        str | None, Query(max_length=1000, description="an arm name; default: the experiment's")
    ] = None,
    threshold: Annotated[
        float | None, Query(description="steps to reach it (5-step running mean) are counted")
    ] = None,
    final_fraction: Annotated[
        float, Query(gt=0, le=1, description="the share of last steps the final value averages")
    ] = 0.1,
    format: Annotated[Literal["json", "csv"], Query(description="json (default) or csv")] = "json",
) -> ExperimentReport | Response:
    """Per arm: the final value of `metric` (median and range over seeds), steps to
    `threshold`, the masked fraction, and against the baseline the paired per-seed differences
    with a bootstrap 95% interval and an exact sign test, from the children's metrics so far."""
    names = [arm["name"] for arm in record.arms]
    chosen = baseline or record.baseline
    if chosen not in names:
        raise HTTPException(422, detail=f"baseline {chosen!r} is no arm ({', '.join(names)})")
    data = await ops.series(store, record)

    def compute() -> dict[str, object]:
        return experiments.report(
            data,
            metric=metric,
            baseline=chosen,
            threshold=threshold,
            final_fraction=final_fraction,
            arm_order=names,
        )

    try:  # scipy's bootstrap: off the event loop
        rep = await anyio.to_thread.run_sync(compute)
    except ValueError as exc:
        raise HTTPException(422, detail=str(exc)) from None
    if format == "csv":
        return Response(
            experiments.report_csv(rep),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{record.id}-report.csv"'},
        )
    return ExperimentReport.model_validate(rep)


@router.get("/{experiment_id}/curves", response_model=ExperimentCurves, responses=_404)
async def experiment_curves(
    record: ExperimentDep,
    store: StoreDep,
    metric: Annotated[str, Query(max_length=200, description="the metric drawn")] = "reward_mean",
) -> ExperimentCurves:
    """Per arm, at each step, the median of `metric` over seeds and its minimum and maximum."""
    data = await ops.series(store, record)
    return ExperimentCurves.model_validate(
        {"metric": metric, "arms": experiments.curves(data, metric)}
    )


__all__ = ["router"]
