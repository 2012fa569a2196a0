"""Running one job on this worker: lease, claim, train in a job process, watch it, finish.

The task takes only a job id and looks the record up again, so a redelivered, requeued or
long-queued task acts on the job as it is now: a finished or cancelled job is skipped, a job whose
lease another worker holds is left to it, and a job that already has checkpoints resumes from the
latest one. Step metrics go out only past the last published step (`pdppo.store`), so a resumed
run neither repeats nor skips a step.

The trainer runs in its own process (`workers.job_process`); this one keeps the lease alive,
watches for a cancel, the job's timeout and a worker shutdown, asks the job to stop, kills it when
it does not stop within the grace period, and records how it ended, including deaths that the
job itself cannot report (the kernel's OOM killer, a signal, a crash of the interpreter).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import redis

from core.checkpoint import latest_checkpoint
from pdppo.settings import Settings, get_settings
from pdppo.spec import JobSpec
from pdppo.store import JobRecord, JobStore
from workers.celery_app import enqueue
from workers.exits import describe_exit, oom_kills
from workers.job_process import JobOptions, job_context, job_main
from workers.lease import Lease, LeaseLost

log = logging.getLogger(__name__)
POLL_SECONDS = 0.2
CANCEL_POLL_SECONDS = 0.5
# A job that said it is stopping is writing its checkpoint: give that time before killing it.
CHECKPOINT_SECONDS = 300.0
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
        outcome = _supervise(store, store.get(job_id) or job, lease, settings)
        handoff = outcome.startswith("stopped")
        return outcome
    finally:
        lease.stop_heartbeat()
        if handoff:
            _hand_off(store, job, lease)
        lease.release()


def _hand_off(store: JobStore, job: JobRecord, lease: Lease) -> None:
    """After a shutdown stop: back to the queue, in one step with giving up the lease."""
    reason = "worker shutting down; queued again to resume from its last checkpoint"
    if store.requeue_if_orphaned(job, reason, lease_token=lease.token) == "requeued":
        enqueue(job.id, job.queue)


def timeout_seconds(job: JobRecord, settings: Settings) -> float:
    """The spec's own limit, else the server's default; never past the server's maximum."""
    minutes = settings.job_timeout_minutes
    try:
        asked = JobSpec.model_validate_json(job.spec_json).resources.timeout_minutes
    except ValueError:
        asked = None  # the job process reports the invalid spec
    if asked is not None:
        minutes = asked
    return 60.0 * min(minutes, settings.max_job_timeout_minutes)


def memory_limit_bytes(settings: Settings) -> int:
    if settings.job_memory_limit_mb is not None:
        return settings.job_memory_limit_mb * 2**20
    return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class _Watch:
    """Why the worker asked its job to stop, and when."""

    def __init__(self) -> None:
        self.reason: str | None = None  # cancel | timeout | shutdown
        self.asked_at = 0.0
        self.heard = False  # the job said it is stopping (and is writing its checkpoint)
        self.killed = False
        self.result: dict[str, Any] | None = None


def _supervise(store: JobStore, job: JobRecord, lease: Lease, settings: Settings) -> str:
    out_dir = job_dir(job.id)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = JobOptions(
        job_id=job.id,
        redis_url=settings.redis_url,
        out_dir=str(out_dir),
        resume=latest_checkpoint(out_dir) is not None,
        memory_limit_bytes=memory_limit_bytes(settings),
        torch_threads=settings.worker_torch_threads,
        log_level=settings.log_level,
        data_roots=tuple(str(root) for root in settings.allowed_data_roots),
        limits=settings.budget_limits("gpu" if job.queue == "gpu" else "cpu"),
    )
    ctx = job_context()
    ours, theirs = ctx.Pipe()
    stop = ctx.Event()
    proc = ctx.Process(target=job_main, args=(options, theirs, stop), name=f"pdppo-job-{job.id}")
    ooms = oom_kills()
    deadline = time.monotonic() + timeout_seconds(job, settings)
    proc.start()
    theirs.close()
    log.info("job %s: training in process %d", job.id, proc.pid)
    watch = _Watch()
    next_cancel_poll = 0.0
    try:
        while proc.exitcode is None:
            proc.join(POLL_SECONDS)
            _read(ours, watch)
            lease.check()
            now = time.monotonic()
            if watch.reason is None:
                if SHUTTING_DOWN.is_set():
                    watch.reason = "shutdown"
                elif now >= deadline:
                    watch.reason = "timeout"
                elif now >= next_cancel_poll:
                    next_cancel_poll = now + CANCEL_POLL_SECONDS
                    if _cancel_requested(store, job.id):
                        watch.reason = "cancel"
                if watch.reason is not None:
                    log.info("job %s: asking it to stop (%s)", job.id, watch.reason)
                    watch.asked_at = now
                    stop.set()
            elif not watch.killed:
                grace = CHECKPOINT_SECONDS if watch.heard else settings.cancel_grace_seconds
                if now - watch.asked_at >= grace:
                    log.warning("job %s: did not stop within %.0fs; killing it", job.id, grace)
                    proc.kill()
                    watch.killed = True
    except LeaseLost:
        proc.kill()  # another worker may hold the job now: not one more write from here
        proc.join()
        log.warning("job %s: lease lost; leaving the job to its new holder", job.id)
        return "abandoned: lease lost"
    finally:
        _read(ours, watch)
        ours.close()
    return _conclude(store, job, watch, proc.exitcode, oom_kills() > ooms, settings)


def _read(conn: Any, watch: _Watch) -> None:
    try:
        while conn.poll():
            message = conn.recv()
            if message["kind"] == "stopping":
                watch.heard = True
            elif message["kind"] == "result":
                watch.result = message
    except (EOFError, OSError):
        pass  # the job process is gone; its exit code says how


def _cancel_requested(store: JobStore, job_id: str) -> bool:
    try:
        return store.cancel_requested(job_id)
    except redis.RedisError:
        log.warning("could not read job %s's cancel flag; retrying", job_id, exc_info=True)
        return False


def _conclude(
    store: JobStore,
    job: JobRecord,
    watch: _Watch,
    exitcode: int | None,
    oom_killed: bool,
    settings: Settings,
) -> str:
    result = watch.result or {}
    outcome = result.get("outcome")
    step = store.get(job.id)
    at = step.step if step is not None else 0
    if outcome == "succeeded":
        extra = {"final_model": result["final_model"]} if result.get("final_model") else {}
        store.finish(job, "succeeded", extra)
        return f"succeeded at step {result['step']}"
    if outcome == "failed":
        return _fail(store, job, result["code"], result["message"], result.get("traceback"))
    if outcome == "missing":
        return "missing"
    if watch.reason == "cancel":
        how = "killed after the grace period" if watch.killed else f"at step {at}"
        store.publish_log(job.id, f"cancelled ({how})")
        store.finish(job, "cancelled")
        return f"cancelled {how}"
    if watch.reason == "timeout":
        limit = timeout_seconds(job, settings) / 60
        message = (
            f"the job ran past its timeout of {limit:g} minutes and was stopped at step {at}; "
            "its checkpoints are kept"
        )
        return _fail(store, job, "timeout", message)
    if watch.reason == "shutdown":
        return f"stopped at step {at} for a worker shutdown"
    code, message = describe_exit(exitcode, oom_killed)
    log.error("job %s: %s", job.id, message)
    return _fail(store, job, code, message)


def _fail(
    store: JobStore, job: JobRecord, code: str, message: str, trace: str | None = None
) -> str:
    store.publish_log(job.id, f"failed ({code}): {message}")
    extra = {"error_code": code, "error_message": message}
    if trace:
        extra["error_traceback"] = trace
    store.finish(job, "failed", extra)
    return f"failed: {code}"
