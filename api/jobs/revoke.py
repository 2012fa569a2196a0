"""Revoking the Celery tasks of jobs cancelled while queued or paused: the one way the job cancel
(`POST /v1/jobs/{id}/cancel`) and the experiment cancel (`POST /v1/experiments/{id}/cancel`) do
it, so that an experiment's cancelled children are dropped by the workers exactly as a cancelled
job is.

Best effort: a task that is not revoked still skips its cancelled job when a worker takes it, so a
broker that fails the revoke is logged, and the cancel stands.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from workers.celery_app import revoke_queued

log = logging.getLogger(__name__)
_limiter: anyio.CapacityLimiter | None = None


def _broker_limiter() -> anyio.CapacityLimiter:
    """Celery's control calls are blocking, so they run in threads; but dozens of threads fighting
    the event loop for the GIL make the tail latency of every request worse than queueing does.
    Two threads at a time; the other requests wait their turn in the event loop."""
    global _limiter
    if _limiter is None:
        _limiter = anyio.CapacityLimiter(2)
    return _limiter


async def revoke_tasks(job_ids: Sequence[str]) -> None:
    """Revokes the tasks of `job_ids` (each job's task id is its id) in one broadcast."""
    if not job_ids:
        return
    try:
        await anyio.to_thread.run_sync(revoke_queued, *job_ids, limiter=_broker_limiter())
    except Exception:  # the task skips a cancelled job by itself anyway
        log.warning("could not revoke the tasks of jobs %s", ", ".join(job_ids), exc_info=True)
