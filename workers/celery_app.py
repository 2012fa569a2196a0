"""The Celery app: a Redis broker, queues `cpu` and `gpu`, one task at a time per worker process.

Imported by the API to enqueue (by task name, so the API never imports torch or the trainer) and
by `pdppo worker`. Delivery is at-least-once (`acks_late`): a task whose worker died is delivered
again, and the job lease (`workers.lease`) keeps a redelivered copy from running a job twice.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from pdppo.settings import get_settings

TRAIN_TASK = "pdppo.train"
QUEUES = ("cpu", "gpu")


def make_celery() -> Celery:
    settings = get_settings()
    app = Celery("pdppo", broker=settings.redis_url, include=["workers.tasks"])
    app.conf.update(
        task_queues=[Queue(name) for name in QUEUES],
        task_default_queue="cpu",
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        # Ack after the task returns, and redeliver if the worker process is lost.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A worker holds exactly the job it runs, never a second one waiting behind it.
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_seconds},
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


celery_app = make_celery()


def enqueue(job_id: str, queue: str) -> None:
    """Send the training task for `job_id`; the Celery task id is the job id (revoke by job)."""
    celery_app.send_task(TRAIN_TASK, args=[job_id], queue=queue, task_id=job_id)


def revoke_queued(job_id: str) -> None:
    """Best effort: workers drop the queued task; the task also skips a cancelled job itself."""
    celery_app.control.revoke(job_id)
