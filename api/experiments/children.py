"""Experiments in the service: creating the child jobs of a grid, and reading them back.

Every child is a job like any other, made by `api.jobs.submission.submit` (the path of
`POST /v1/jobs`): the same admission, quota, outbox and task. What an experiment adds is
all-or-nothing checking (every child is validated and admitted before the first is created, so a
bad arm refuses the experiment and leaves no job behind), crash-safe creation (children are
created under keys derived from the experiment, `pdppo.store.experiments`), and its place in the
queue: children are created seed-major (every arm of seed 0, then seed 1, ...) so that the runs
done so far stay paired, and the experiment takes turns with the tenant's plain jobs and other
experiments (`pdppo.store.jobs.fair`), so a grid of dozens of runs never holds a tenant's next job
back until it has all run, nor does a stream of jobs hold the experiment back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Request
from pydantic import ValidationError

from api.experiments.schemas import Experiment, ExperimentArm, ExperimentRun
from api.jobs.admission import admit
from api.jobs.pending_writes import pending_write
from api.jobs.publisher import TaskPublisher
from api.jobs.submission import submit
from api.routes.storage import refuse_over_quota
from api.schemas import Progress
from core.config.names import explained
from core.experiments import ExperimentSpec, arms, child_spec, seed_list
from pdppo.settings import Settings
from pdppo.spec import JobSpec
from pdppo.store import (
    AsyncJobStore,
    JobRecord,
    job_key,
    new_job_id,
    spec_digest,
    tenant_active_key,
)
from pdppo.store.experiments import ExperimentRecord
from pdppo.store.keys import child_idempotency

if TYPE_CHECKING:
    from core.experiments.stats import Series


@dataclass(frozen=True)
class Child:
    arm_index: int
    arm: str
    seed: int
    spec: JobSpec


def _where(arm: str, seed: int) -> str:
    return f"arm {arm!r}, seed {seed}"


def children(spec: ExperimentSpec) -> list[Child]:
    """Every child's job spec, seed-major; a 422 naming the arm and seed of the first that is
    not a valid job spec."""
    grid = arms(spec)
    out: list[Child] = []
    for seed in seed_list(spec):
        for index, arm in enumerate(grid):
            raw = child_spec(spec, arm, seed)
            try:
                job = JobSpec.model_validate(raw)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                    for e in explained(exc.errors(), JobSpec)
                )
                raise HTTPException(
                    422, detail=f"{_where(arm.name, seed)}: not a valid job spec: {problems}"
                ) from None
            out.append(Child(index, arm.name, seed, job))
    return out


async def _admit_all(
    kids: list[Child], settings: Settings, tenant: str, store: AsyncJobStore
) -> None:
    """Every refusal `POST /v1/jobs` would give any child, before any is created. Children that
    differ only in their seed cost the same, so one admission per distinct spec but the seed."""
    seen: dict[str, str] = {}
    for kid in kids:
        key = kid.spec.model_copy(
            update={"train": kid.spec.train.model_copy(update={"seed": 0})}
        ).model_dump_json(exclude={"name"})
        if key in seen:
            continue
        _, _, problems = await admit(kid.spec, settings, tenant, store)
        if problems:
            why = "; ".join(p.message for p in problems)
            raise HTTPException(422, detail=f"{_where(kid.arm, kid.seed)}: {why}")
        seen[key] = kid.arm


async def create(
    request: Request,
    spec: ExperimentSpec,
    tenant: str,
    store: AsyncJobStore,
    settings: Settings,
    publisher: TaskPublisher,
    idempotency_key: str | None,
) -> tuple[ExperimentRecord, bool]:
    """The experiment with all its children queued, and whether an Idempotency-Key's earlier
    one was returned (its missing children, if its creation died half way, made now)."""
    kids = children(spec)
    spec_json = spec.model_dump_json()
    known = await store.experiments.find(tenant, idempotency_key) if idempotency_key else None
    existing = await store.experiments.get(tenant, known) if known else None
    if existing is not None and existing.spec_digest != spec_digest(spec_json):
        raise HTTPException(
            409, detail="Idempotency-Key was already used with a different experiment spec"
        )
    made = existing.runs if existing is not None else {}
    missing = [k for k in kids if (k.arm_index, k.seed) not in made]
    if existing is not None and not missing:
        # a replay, answered before the checks that refuse new jobs (`api.jobs.submission`)
        return existing, True
    await refuse_over_quota(store.redis, settings, tenant)  # 507
    await _admit_all(missing, settings, tenant, store)  # the children to make: new jobs
    active = int(await store.redis.scard(tenant_active_key(tenant)))
    if missing and active + len(missing) > settings.max_active_jobs_per_tenant:
        raise HTTPException(
            429,
            detail=(
                f"the experiment needs {len(missing)} jobs and tenant {tenant!r} has {active} "
                f"queued, running or paused of its limit of "
                f"{settings.max_active_jobs_per_tenant} (PDPPO_MAX_ACTIVE_JOBS_PER_TENANT)"
            ),
            headers={"Retry-After": "30"},
        )
    # The record's write may land after its answer was lost: the 503 names the experiment then
    # (`api.jobs.pending_writes`), and a retry with the same Idempotency-Key finds it. (With an
    # earlier one found by its key, `begin` only looks it up again: that one is named.)
    fresh_id = new_job_id()
    named = fresh_id if existing is None else existing.id
    pending_write(request, "experiment", named, f"the creation of experiment {named}")
    experiment_id, created = await store.experiments.begin(
        experiment_id=fresh_id,
        tenant=tenant,
        name=spec.name,
        spec_json=spec_json,
        baseline=spec.baseline_arm,
        arms=[{"name": a.name, "overrides": a.overrides} for a in arms(spec)],
        seeds=seed_list(spec),
        idempotency=idempotency_key,
        idempotency_ttl=settings.idempotency_ttl_seconds,
    )
    record = existing if not created else await store.experiments.get(tenant, experiment_id)
    if record is None or record.spec_digest != spec_digest(spec_json):  # a concurrent twin
        raise HTTPException(
            409, detail="Idempotency-Key was already used with a different experiment spec"
        )
    for kid in kids:
        if (kid.arm_index, kid.seed) in record.runs:
            continue
        submitted = await submit(
            request,
            kid.spec,
            tenant,
            store=store,
            settings=settings,
            publisher=publisher,
            idempotency_key=child_idempotency(experiment_id, kid.arm_index, kid.seed),
            experiment=experiment_id,
            admitted=True,
        )
        await store.experiments.add_run(
            tenant, experiment_id, kid.arm_index, kid.seed, submitted.record.id
        )
    final = await store.experiments.get(tenant, experiment_id)
    assert final is not None
    return final, not created


async def child_jobs(store: AsyncJobStore, record: ExperimentRecord) -> dict[str, JobRecord]:
    """The children that still exist, by job id."""
    pipe = store.redis.pipeline(transaction=False)
    ids = [job_id for _, _, job_id in record.ordered_runs()]
    for job_id in ids:
        pipe.hgetall(job_key(job_id))
    return {
        job_id: JobRecord.from_hash(raw)
        for job_id, raw in zip(ids, await pipe.execute(), strict=True)
        if raw
    }


def status_of(statuses: list[str]) -> str:
    if not statuses:
        return "cancelled"
    for active in ("running", "queued", "paused"):
        if active in statuses:
            return active
    ended = set(statuses)
    return statuses[0] if len(ended) == 1 else "partial"


def to_experiment(record: ExperimentRecord, jobs: dict[str, JobRecord]) -> Experiment:
    arm_views = []
    statuses: list[str] = []
    for index, arm in enumerate(record.arms):
        runs = []
        for seed in record.seeds:
            job_id = record.runs.get((index, seed))
            job = jobs.get(job_id) if job_id else None
            if job is None:
                continue
            statuses.append(job.status)
            runs.append(
                ExperimentRun(
                    seed=seed,
                    job_id=job.id,
                    status=job.status,  # type: ignore[arg-type]
                    progress=Progress(step=job.step, total=job.total_steps),
                )
            )
        arm_views.append(ExperimentArm(name=arm["name"], overrides=arm["overrides"], runs=runs))
    return Experiment(
        id=record.id,
        name=record.name,
        status=status_of(statuses),  # type: ignore[arg-type]
        created_at=datetime.fromisoformat(record.created_at),
        spec=record.spec,
        baseline=record.baseline,
        arms=arm_views,
        counts=dict(Counter(statuses)),
    )


async def series(store: AsyncJobStore, record: ExperimentRecord) -> Series:
    """arm -> seed -> the child's per-step metric rows (its `/metrics` history), flattened to
    `{"step": s, <metric>: v, ...}` as `core.experiments.report` reads them; seeds without any
    row yet are left out."""
    out: dict[str, dict[int, list[dict[str, Any]]]] = {arm["name"]: {} for arm in record.arms}
    for (index, seed), job_id in sorted(record.runs.items(), key=lambda r: (r[0][1], r[0][0])):
        rows = await store.metrics_history(job_id)
        if rows:
            flat = [{"step": row["step"], **row["metrics"]} for row in rows]
            out[record.arms[index]["name"]][seed] = flat
    return out
