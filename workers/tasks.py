"""The Celery task (`pdppo.train`) and the worker-start hooks (the job fork server, the reaper and
the outbox dispatcher, `workers.upkeep.reaper`)."""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import Reject
from celery.signals import worker_ready, worker_shutting_down

from pdppo.settings import get_settings
from pdppo.store import JobStore
from workers.celery_app import TRAIN_TASK, celery_app
from workers.job.process import job_context
from workers.job.runner import SHUTTING_DOWN, redis_client, run_job, worker_name
from workers.upkeep.heartbeat import Heartbeat
from workers.upkeep.reaper import DispatchTiming, start_reaper
from workers.upkeep.retention import start_retention

log = logging.getLogger(__name__)


@celery_app.task(name=TRAIN_TASK)
def train_job(job_id: str) -> str:
    if SHUTTING_DOWN.is_set():  # back to the broker, for the next worker
        raise Reject("worker shutting down", requeue=True)
    outcome = run_job(job_id)
    log.info("job %s: %s", job_id, outcome)
    return outcome


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
