"""Submitting a job: the one path from an admitted spec to a queued job, shared by
`POST /v1/jobs` and `POST /v1/fine_tuning/jobs` (`api.openai`), which differ only in how they
read the request and show the job.

The job and its outbox entry are one write; the task is published after it, by a thread of
this process, off the request path. If this process dies in between, or the publish fails,
the job is still queued and a worker's dispatcher publishes its task within seconds
(`pdppo.store.jobs.outbox`), so a job this returns, new or replayed for an Idempotency-Key, always
runs: a failed publish is logged, not a 503 and a failed job that every retry with the same
key would get back. A 503 after the write was sent names the job it may have created
(`api.jobs.pending_writes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import HTTPException, Request

from api.http.observability import JOBS_SUBMITTED
from api.jobs.admission import admit
from api.jobs.pending_writes import pending_write
from api.jobs.publisher import TaskPublisher
from api.routes.storage import refuse_over_quota
from api.schemas import SpecProblem
from pdppo.settings import Settings
from pdppo.spec import JobSpec
from pdppo.store import AsyncJobStore, JobRecord, new_job_id, spec_digest
from workers.celery_app import task_priority


class SpecRefused(HTTPException):
    """A 422 for a spec admission refuses; `problems` name the fields (an OpenAI error's
    `param`)."""

    def __init__(self, problems: list[SpecProblem]) -> None:
        super().__init__(422, detail="; ".join(p.message for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class Submitted:
    record: JobRecord
    replayed: bool  # an Idempotency-Key's earlier job, returned again


async def submit(
    request: Request,
    spec: JobSpec,
    tenant: str,
    store: AsyncJobStore,
    settings: Settings,
    publisher: TaskPublisher,
    idempotency_key: str | None,
    *,
    openai_json: str | None = None,
    metadata: Mapping[str, str] | None = None,
    experiment: str | None = None,
    admitted: bool = False,
) -> Submitted:
    """The new job, queued (its task published), or the one `idempotency_key` already made
    with this spec. Raises 507 over the storage quota, `SpecRefused` (422) for what admission
    refuses, 429 past the tenant's active-job limit, 409 for a key reused with another spec.

    A replay is never refused by those checks, which refuse a NEW job: since the first answer
    the tenant may have passed its quota, a limit may have been lowered or a file the spec names
    deleted, and a client retrying a create whose answer it lost must get the job it made, not a
    refusal that reads as "no job" (issue 49). So a refusal looks the key up first, and answers
    its job if it made one. (Only a refusal: the create script looks the key up itself, in the
    same step as it creates, and a lookup before it would be one more Redis call in the way of
    every create, the call a store stall would meet first, before the create's write is sent
    and named in the 503: `api.jobs.pending_writes`.)

    `experiment`: the experiment the job is a child of (a flow of its own in the fair order,
    `pdppo.store.jobs.fair`); `admitted`: the caller has run the quota and admission
    checks already (an experiment checks every child before it creates any)."""
    spec_json = spec.model_dump_json()
    if not admitted:
        try:
            await refuse_over_quota(store.redis, settings, tenant)  # 507: api.routes.storage
            _, _, problems = await admit(spec, settings, tenant, store)
            if problems:
                raise SpecRefused(problems)
        except HTTPException:
            known = await _made_by(store, tenant, idempotency_key)
            if known is None:
                raise
            return Submitted(_same_spec(known, spec_json), replayed=True)
    queue = spec.queue
    job_id = new_job_id()
    pending_write(request, "job", job_id, f"the creation of job {job_id}")
    if metadata:  # before the job: never a job its index misses (`pdppo.store.metadata`)
        await store.metadata.add(tenant, job_id, metadata)
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
        job_id=job_id,
        openai_json=openai_json,
        experiment=experiment,
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
        return Submitted(_same_spec(record, spec_json), replayed=True)
    if settings.api_publish_tasks:
        # off the request path: see api/jobs/publisher.py
        publisher.submit(record.id, queue, task_priority(experiment))
    JOBS_SUBMITTED.labels(queue).inc()
    return Submitted(record, replayed=False)


async def _made_by(store: AsyncJobStore, tenant: str, key: str | None) -> JobRecord | None:
    return None if key is None else await store.idempotent_job(tenant, key)


def _same_spec(record: JobRecord, spec_json: str) -> JobRecord:
    """The job an Idempotency-Key made, if it was made with this spec; else 409."""
    if record.spec_digest != spec_digest(spec_json):
        raise HTTPException(
            409, detail="Idempotency-Key was already used with a different job spec"
        )
    return record
