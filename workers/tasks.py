"""The Celery task (`pdppo.train`) and the worker-start hooks (the job fork server, the reaper and
the outbox dispatcher, `workers.upkeep.reaper`).

A task is a turn on its queue: the worker starts the job the fair order puts first on that queue
(`pdppo.store.jobs.fair`: tenants, then each tenant's plain jobs and experiments, take turns),
which is the task's own job only when that one is next. Docs: docs/operators/scaling.md."""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import Reject
from celery.signals import worker_ready, worker_shutting_down

from pdppo.settings import get_settings
from pdppo.store import JobRecord, JobStore
from workers.celery_app import (
    TRAIN_TASK,
    broker_view,
    celery_app,
    enqueue,
    restore_taken,
    task_priority,
)
from workers.job.process import job_context
from workers.job.runner import SHUTTING_DOWN, redis_client, run_job, store_retry, worker_name
from workers.upkeep.heartbeat import Heartbeat
from workers.upkeep.reaper import DispatchTiming, start_reaper
from workers.upkeep.retention import start_retention

log = logging.getLogger(__name__)


@celery_app.task(name=TRAIN_TASK)
def train_job(job_id: str) -> str:
    if SHUTTING_DOWN.is_set():  # back to the broker, for the next worker
        raise Reject("worker shutting down", requeue=True)
    chosen = next_job(job_id)
    outcome = run_job(chosen)
    turn = "" if chosen == job_id else f" (in the turn of job {job_id}'s task)"
    log.info("job %s: %s%s", chosen, outcome, turn)
    return outcome


def next_job(task_job: str) -> str:
    """The job this task starts: the one the fair order puts first on the task's queue (its own
    when its own flow is next), or the task's own when the order has none (a job queued before
    it existed: the outbox dispatcher adds those when a worker starts). When it is another job
    and the task's own still waits, the task is given back (`give_back`)."""
    retry = store_retry(get_settings())
    store = JobStore(redis_client())
    job = retry.call(f"read job {task_job}", lambda: store.get(task_job))
    if job is None:
        return task_job
    chosen = retry.call(
        f"the next job of {job.queue}", lambda: store.fair.next(job.queue, own=task_job)
    )
    if chosen is None or chosen == task_job:
        return task_job
    if job.status == "queued":
        retry.call(f"give job {task_job}'s task back", lambda: give_back(store, job))
    return chosen


def give_back(store: JobStore, job: JobRecord) -> None:
    """The task of `job`, which still waits while its worker starts another, back at the head
    of its queue, where it was (kombu's restore of a message taken and not acknowledged: the
    worker's acknowledgement when the other job ends then finds nothing to remove). So every
    queued job keeps a task of its own, which the outbox dispatcher looks for by the job's id
    (it would put back a task taken by a worker that never claimed its job), and the tasks keep
    their order, so a tenant's jobs start in the order they came. A task not found taken (its
    worker's take not recorded yet) is sent again instead."""
    taken = broker_view(store.redis, [job.queue]).latest(job.id)
    if taken is not None:
        restore_taken(taken.tag)
    else:
        enqueue(job.id, job.queue, task_priority(job.experiment))


@worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    settings = get_settings()
    job_context()  # the fork server imports torch and the trainer now, not at the first job
    store = JobStore(redis_client())
    start_reaper(
        store,
        interval=max(1.0, settings.lease_seconds / 2),
        max_worker_losses=settings.max_worker_losses,
        timing=DispatchTiming.from_settings(settings),
        outage_hold=settings.lease_seconds,
        heartbeat=Heartbeat(settings.worker_heartbeat_dir, worker_name(), client=store.redis),
        lease_seconds=settings.lease_seconds,
    )
    start_retention(JobStore(redis_client()), settings)  # old artifacts, interrupted deletes


@worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    SHUTTING_DOWN.set()
