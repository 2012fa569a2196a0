"""Running one job on this worker: lease, claim, train with a publishing callback, finish.

The task takes only a job id and looks the record up again, so a redelivered, requeued or
long-queued task acts on the job as it is now: a finished or cancelled job is skipped, a job whose
lease another worker holds is left to it, and a job that already has checkpoints resumes from the
latest one. Step metrics go out only past the last published step (`pdppo.jobstore`), so a resumed
run neither repeats nor skips a step.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import traceback
from functools import lru_cache
from pathlib import Path

import redis

from core.checkpoint import latest_checkpoint
from core.trainer import TrainerCallback, train
from pdppo.jobstore import JobRecord, JobStore
from pdppo.settings import get_settings
from pdppo.spec import JobSpec
from workers.celery_app import enqueue
from workers.lease import Lease, LeaseLost

log = logging.getLogger(__name__)
TRACEBACK_CHARS = 4000
# Set when the worker is asked to shut down (SIGTERM, Ctrl-C): the running job checkpoints, goes
# back to the queue and resumes on the next worker, instead of holding up the shutdown for hours.
SHUTTING_DOWN = threading.Event()


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(get_settings().redis_url, decode_responses=True)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def job_dir(job_id: str) -> Path:
    return get_settings().artifact_dir / job_id


class JobCallback(TrainerCallback):
    """Publishes the trainer's progress to the job's record and event stream."""

    def __init__(self, store: JobStore, job: JobRecord, lease: Lease) -> None:
        self.store = store
        self.job = job
        self.lease = lease

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.lease.check()  # before anything is written for this step
        # The step is the event's own field; metrics are the numbers measured at it.
        clean = {k: float(v) for k, v in metrics.items() if k != "step"}
        self.store.publish_step(self.job.id, step, self.job.total_steps, clean)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.store.publish_checkpoint(self.job.id, step, path.name)

    def on_log(self, message: str) -> None:
        self.store.publish_log(self.job.id, message)

    def should_stop(self) -> bool:
        self.lease.check()
        return SHUTTING_DOWN.is_set() or self.store.cancel_requested(self.job.id)


def run_job(job_id: str) -> str:
    """Run or resume `job_id`; returns what happened (for the worker's log)."""
    settings = get_settings()
    store = JobStore(redis_client())
    job = store.get(job_id)
    if job is None:
        return "missing"
    if job.terminal:
        return f"skipped: already {job.status}"
    lease = Lease(store.redis, job_id, settings.lease_seconds, worker_name())
    if not lease.acquire():
        return "skipped: another worker holds the lease"
    handoff = False
    try:
        if not store.claim(job_id, worker_name()):
            return "skipped: no longer queued"
        lease.start_heartbeat()
        outcome = _train(store, store.get(job_id) or job, lease)
        handoff = outcome.startswith("stopped")
        return outcome
    finally:
        lease.stop_heartbeat()
        if handoff:
            _hand_off(store, job, lease)
        lease.release()
        _release_memory()


def _hand_off(store: JobStore, job: JobRecord, lease: Lease) -> None:
    """After a shutdown stop: back to the queue, in one step with giving up the lease."""
    reason = "worker shutting down; queued again to resume from its last checkpoint"
    if store.requeue_if_orphaned(job, reason, lease_token=lease.token) == "requeued":
        enqueue(job.id, job.queue)


def _train(store: JobStore, job: JobRecord, lease: Lease) -> str:
    try:
        spec = JobSpec.model_validate_json(job.spec_json)
    except ValueError as exc:
        store.finish(job, "failed", _error("invalid_spec", exc))
        return "failed: invalid spec"
    try:
        out_dir = job_dir(job.id)
        out_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = latest_checkpoint(out_dir)
        if checkpoint is not None:
            store.publish_log(job.id, f"resuming from {checkpoint}")
        result = train(
            spec.train,
            out_dir,
            callback=JobCallback(store, job, lease),
            resume=checkpoint is not None,
        )
    except LeaseLost:
        log.warning("job %s: lease lost; leaving the job to its new holder", job.id)
        return "abandoned: lease lost"
    except Exception as exc:
        log.exception("job %s failed", job.id)
        store.finish(job, "failed", _error("training_error", exc))
        return f"failed: {type(exc).__name__}"
    if result.stopped and store.cancel_requested(job.id):
        store.finish(job, "cancelled")
        return f"cancelled at step {result.step}"
    if result.stopped:  # the worker is shutting down; `run_job` queues the job again
        return f"stopped at step {result.step} for a worker shutdown"
    extra = {"final_model": str(result.final_model)} if result.final_model else {}
    store.finish(job, "succeeded", extra)
    return f"succeeded at step {result.step}"


def _error(code: str, exc: BaseException) -> dict[str, str]:
    text = "".join(traceback.format_exception(exc))
    return {
        "error_code": code,
        "error_message": f"{type(exc).__name__}: {exc}"[:2000],
        "error_traceback": text[-TRACEBACK_CHARS:],
    }


def _release_memory() -> None:
    """Hand the job's GPU memory back before the next job (one job per GPU at a time)."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        log.info("GPU memory after the job: %d bytes reserved", torch.cuda.memory_reserved())
