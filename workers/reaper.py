"""Finds running jobs whose worker died (lease expired) and queues them again to resume.

Celery alone would redeliver the dead worker's task only after `visibility_timeout` (an hour), and
a copy it redelivered earlier may already have been dropped by the lease check; so every worker
runs this loop. The requeue is one Lua script that also flips the job to `queued`, so of several
reapers exactly one re-sends the task.
"""

from __future__ import annotations

import logging
import threading

import redis

from pdppo.store import JobStore
from workers.celery_app import enqueue

log = logging.getLogger(__name__)


def reap_once(store: JobStore, max_worker_losses: int = 0) -> list[str]:
    """Requeue every orphaned running job; returns the ids sent again."""
    sent: list[str] = []
    for job_id in store.running_job_ids():
        job = store.get(job_id)
        if job is None:
            store.redis.srem("pdppo:running", job_id)
            continue
        outcome = store.requeue_if_orphaned(job, max_worker_losses=max_worker_losses)
        if outcome == "failed":
            log.error("job %s lost its worker too often; marked failed", job.id)
        if outcome == "requeued":
            enqueue(job.id, job.queue)
            log.warning("job %s lost its worker; queued again on %s", job.id, job.queue)
            sent.append(job.id)
    return sent


def start_reaper(store: JobStore, interval: float, max_worker_losses: int = 0) -> threading.Event:
    """Runs `reap_once` every `interval` seconds in a daemon thread; set the event to stop."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            try:
                reap_once(store, max_worker_losses)
            except redis.RedisError:
                log.warning("reaper could not reach Redis; retrying", exc_info=True)
            except Exception:
                log.exception("reaper failed; retrying")

    threading.Thread(target=loop, name="pdppo reaper", daemon=True).start()
    return stop
