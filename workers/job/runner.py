"""Running one job on this worker: lease, claim, train in a job process, watch it, finish.

The task takes only a job id and looks the record up again, so a redelivered, requeued or
long-queued task acts on the job as it is now: a finished or cancelled job is skipped, a job whose
lease another worker holds is left to it, and a job that already has checkpoints resumes from the
latest one. Step metrics go out only past the last published step (`pdppo.store`), so a resumed
run neither repeats nor skips a step.

The trainer runs in its own process (`workers.job.process`); this one keeps the lease alive,
watches for a cancel, the job's timeout and a worker shutdown, asks the job to stop, kills it when
it does not stop within the grace period, and records how it ended, including deaths that the
job itself cannot report (the kernel's OOM killer, a signal, a crash of the interpreter).

A Redis stall is not the job's fault (docs/developers/design.md#redis-outages): every store call
here goes through `StoreRetry` (bounded backoff, `PDPPO_STORE_OUTAGE_SECONDS`), the cancel flag is
read from a thread of its own so that the watch loop never waits on Redis, and the job process keeps
training while its events wait in its outgoing queue. Only the lease bounds a stall: when it expired
while Redis was unreachable, the job process is stopped (another worker may take the job) and, once
Redis answers again, the job is handed back with that reason, not counted as a lost worker.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import redis

from core.tracking import TrackingOptions
from core.training.checkpoint import latest_checkpoint
from pdppo.queues import queue_device
from pdppo.settings import Settings, get_settings
from pdppo.spec import JobSpec
from pdppo.store import JobRecord, JobStore, StoreConfig, StoreRetry, StoreUnavailable, store_client
from pdppo.store.jobs.worker_side import FencedOut
from pdppo.store.retry import publish_log_once
from workers.celery_app import enqueue, task_priority
from workers.job.cores import leave as leave_host
from workers.job.exits import describe_exit, oom_kills
from workers.job.lease import Lease, LeaseLost
from workers.job.process import JobOptions, job_context, job_main
from workers.job.storage import clear_temps

log = logging.getLogger(__name__)
T = TypeVar("T")
POLL_SECONDS = 0.2
CANCEL_POLL_SECONDS = 0.5
# A job that said it is stopping is writing its checkpoint: give that time before killing it.
CHECKPOINT_SECONDS = 300.0
# Set when the worker is asked to shut down (SIGTERM, Ctrl-C): the running job checkpoints, goes
# back to the queue and resumes on the next worker, instead of holding up the shutdown for hours.
SHUTTING_DOWN = threading.Event()


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    """The worker's client (its reaper shares it): deliberate timeouts and no retries behind the
    caller's back (`pdppo.store.retry`)."""
    settings = get_settings()
    return store_client(settings.redis_url, StoreConfig.from_settings(settings))


def store_retry(settings: Settings) -> StoreRetry:
    return StoreRetry.from_config(StoreConfig.from_settings(settings))


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def job_dir(job_id: str) -> Path:
    return get_settings().artifact_dir / job_id


@dataclass(frozen=True)
class _Outcome:
    """What happened (for the worker's log), and why to hand the job back (None: don't)."""

    text: str
    hand_back: str | None = None


SHUTDOWN_REASON = "worker shutting down; queued again to resume from its last checkpoint"
PAUSE_REASON = "the pause was withdrawn while the job stopped; queued again to run on"
# What a hand back did, by the requeue script's answer (`JobStore.requeue_if_orphaned`), for the
# worker's log: the reason handed to the script is the job's log line of one branch only
# (`requeued`), so a job stopped for a pause and parked as paused must not be said to be queued.
HANDED_BACK = {
    "paused": "it waits for a resume",
    "cancelled": "a cancel came while it stopped",
    "failed": "it lost more workers than allowed",
    "not-running": "it was no longer running (ended, or handed back by a reaper); left as it is",
    "leased": "another worker holds its lease; left to it",
}


def run_job(job_id: str) -> str:
    """Run or resume `job_id`; returns what happened (for the worker's log).

    Raises `StoreUnavailable` when Redis stays unreachable before the job is claimed (it is
    still queued then)."""
    settings = get_settings()
    retry = store_retry(settings)
    store = JobStore(redis_client())
    job = retry.call(f"read job {job_id}", lambda: store.get(job_id))
    if job is None:
        return "missing"
    if job.terminal:
        return f"skipped: already {job.status}"
    lease = Lease(store.redis, job_id, settings.lease_seconds, worker_name(), retry)
    if not lease.acquire():
        return "skipped: another worker holds the lease"
    outcome = _Outcome("abandoned")
    handed: str | None = None
    try:
        claimed = retry.call(
            f"claim job {job_id}",
            lambda: store.claim(job_id, worker_name()),
            recover=lambda: _claimed(store, job),
            before_retry=lease.check,  # not past the lease: someone else may take the job then
        )
        if not claimed:
            return "skipped: no longer queued"
        lease.start_heartbeat()
        outcome = _supervise(store, retry, job, lease, settings)
    except LeaseLost as lost:
        outcome = _after_lease_lost(job, lease, lost)
    finally:
        # Hand back before waiting for the heartbeat thread, which may sit in a renewal until a
        # stalled Redis wakes: a request sent now is served as soon as Redis wakes, ahead of a
        # reaper's that needs several round trips, so the job's log gets the true reason.
        if outcome.hand_back is not None:
            handed = _hand_back(store, retry, job, lease, outcome.hand_back)
        lease.stop_heartbeat()
        lease.release()
    return ended_as(outcome, handed)


def ended_as(outcome: _Outcome, handed: str | None) -> str:
    """What the task logs: how the job stopped, then, for one handed back, where it went (the
    requeue script's answer: `paused`, `requeued`, `cancelled`, ...), decided only then."""
    if outcome.hand_back is None:
        return outcome.text
    return f"{outcome.text}; handed back: {handed or 'not recorded (Redis unreachable)'}"


def _after_lease_lost(job: JobRecord, lease: Lease, lost: LeaseLost) -> _Outcome:
    log.warning("job %s: %s; leaving the job to its next holder", job.id, lost)
    if not lost.unreachable:
        return _Outcome("abandoned: lease lost")
    # Nobody could take the job while Redis was away: once it answers, hand the job back
    # saying so, unless a reaper or another worker got to it first.
    why = (
        f"lease expired while Redis was unreachable ({lease.lost_reason}); queued again to "
        "resume from its last checkpoint"
    )
    return _Outcome("abandoned: lease expired while Redis was unreachable", why)


def _claimed(store: JobStore, before: JobRecord) -> bool | None:
    """After a claim whose reply was lost: True if it landed (this worker holds the lease, so
    nobody else can have counted an attempt meanwhile), None to send it again."""
    now = store.get(before.id)
    if now is not None and now.status == "running" and now.attempts > before.attempts:
        return True
    return None


def _hand_back(
    store: JobStore, retry: StoreRetry, job: JobRecord, lease: Lease, why: str
) -> str | None:
    """Back to the queue, in one step with giving up the lease (no worker loss is counted).

    Also after a lease that expired while Redis was unreachable: the script requeues only a job
    that is still running and whose lease nobody holds, exactly what a reaper would do, but with
    the reason that is true; the reapers hold off for a while after such a stall
    (`pdppo.store.jobs.clock`) so that this comes first. A requeue whose reply was lost is seen
    by the job being queued; the task is then sent again (a duplicate task finds the job taken
    or finished and skips it). Tried until Redis answers, however long it is away (a reaper
    would count the job's worker as lost otherwise), unless the worker is shutting down.
    Returns the script's answer, None when Redis never answered."""

    def landed() -> str | None:
        now = store.get(job.id)
        return "requeued" if now is not None and now.status == "queued" else None

    while True:
        try:
            result = retry.call(
                f"hand job {job.id} back",
                lambda: store.requeue_if_orphaned(
                    job, why, lease_token=lease.token, lease_seconds=lease.seconds
                ),
                recover=landed,
            )
            break
        except StoreUnavailable:
            if SHUTTING_DOWN.is_set():
                log.error(
                    "job %s: could not hand it back; a reaper will once Redis answers", job.id
                )
                return None
            log.error("job %s: could not hand it back yet; trying on until Redis answers", job.id)
    said = why if result == "requeued" else HANDED_BACK.get(result, why)
    log.info("job %s: handed back (%s): %s", job.id, result, said)
    if result == "requeued":
        enqueue(job.id, job.queue, task_priority(job.experiment))
    return result


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
        self.reason: str | None = None  # cancel | pause | timeout | shutdown
        self.asked_at = 0.0
        self.heard = False  # the job said it is stopping (and is writing its checkpoint)
        self.killed = False
        self.result: dict[str, Any] | None = None


def _supervise(
    store: JobStore, retry: StoreRetry, job: JobRecord, lease: Lease, settings: Settings
) -> _Outcome:
    out_dir = job_dir(job.id)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = JobOptions(
        job_id=job.id,
        redis_url=settings.redis_url,
        out_dir=str(out_dir),
        resume=latest_checkpoint(out_dir) is not None,
        memory_limit_bytes=memory_limit_bytes(settings),
        torch_threads=settings.job_threads or settings.worker_torch_threads,
        threads_setting=(
            "PDPPO_WORKER_TORCH_THREADS" if settings.job_threads is None else "PDPPO_JOB_THREADS"
        ),
        log_level=settings.log_level,
        data_roots=tuple(str(root) for root in settings.allowed_data_roots),
        limits=settings.budget_limits(queue_device(job.queue)),
        store=StoreConfig.from_settings(settings),
        artifact_dir=str(settings.artifact_dir),
        lease_token=lease.token,  # the claim's fencing token: every write of the job passes it
        lease_seconds=lease.seconds,
        storage=settings.storage_reserve(),
        jobs_at_once=settings.worker_jobs_at_once,
        graders=settings.grader_options(),
        tracking=settings.tracking_options(
            job.id, {"pdppo.job": job.id, "pdppo.tenant": job.tenant}
        ),
    )
    ctx = job_context()
    ours, theirs = ctx.Pipe()
    stop = ctx.Event()
    # set for a cancel (before `stop`, or after it, when a cancel follows a pause): the job stops
    # at once and keeps nothing; any other stop lets it finish the step it is in and checkpoint
    cancelled = ctx.Event()
    proc = ctx.Process(
        target=job_main, args=(options, theirs, stop, cancelled), name=f"pdppo-job-{job.id}"
    )
    ooms = oom_kills()
    deadline = time.monotonic() + timeout_seconds(job, settings)
    cancel = _CancelWatch(store, job.id, lease.token)
    proc.start()
    theirs.close()
    log.info("job %s: training in process %d", job.id, proc.pid)
    watch = _Watch()
    cancel.start()
    try:
        while proc.exitcode is None:
            proc.join(POLL_SECONDS)
            _read(ours, watch)
            lease.check()
            now = time.monotonic()
            if cancel.requested.is_set():
                cancelled.set()
            if watch.reason is None:
                if SHUTTING_DOWN.is_set():
                    watch.reason = "shutdown"
                elif now >= deadline:
                    watch.reason = "timeout"
                elif cancel.requested.is_set():
                    watch.reason = "cancel"
                elif cancel.pause.is_set():
                    watch.reason = "pause"
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
        _read(ours, watch)
        if proc.exitcode != 0:  # killed or crashed, maybe mid-write; still this claim's job
            clear_temps(out_dir)
        return _conclude(
            store,
            retry,
            job,
            lease=lease,
            watch=watch,
            exitcode=proc.exitcode,
            oom_killed=oom_kills() > ooms,
            settings=settings,
        )
    except LeaseLost as lost:
        proc.kill()  # another worker may hold the job now: not one more write from here
        proc.join()
        return _after_lease_lost(job, lease, lost)
    except StoreUnavailable as exc:
        log.error("job %s: %s; leaving it to expire and be resumed", job.id, exc)
        return _Outcome("abandoned: Redis unreachable")
    finally:
        cancel.stop()
        ours.close()
        leave_host(store.redis, job.id)  # its cores are the other jobs' at once


class _CancelWatch:
    """Reads the job's cancel and pause flags every CANCEL_POLL_SECONDS in a thread of its own,
    so that a stalled Redis holds up this read only, never the loop that watches the lease, the
    timeout and the job process. A failed read is just tried again at the next poll. A pause
    seen goes on polling: a cancel that follows still wins.

    A pause is carried out only once the store has marked it so (`JobStore.begin_pause`, in one
    script with the check that it is still asked for): a resume that withdraws it after that
    says the job stops anyway and is queued again, one before it that the job runs on, and
    each is then true."""

    def __init__(self, store: JobStore, job_id: str, lease_token: str) -> None:
        self.store = store
        self.job_id = job_id
        self.lease_token = lease_token
        self.requested = threading.Event()
        self.pause = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name=f"cancel {job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # not joined: a read stuck on a stalled Redis ends with its timeout

    def _poll(self) -> None:
        failing = False
        while not self._stop.wait(CANCEL_POLL_SECONDS):
            try:
                cancel, pause = self.store.stop_flags(self.job_id)
                if cancel:
                    self.requested.set()
                    return
                if pause and not self.pause.is_set() and self._begin_pause():
                    self.pause.set()
            except redis.RedisError as exc:
                if not failing:
                    log.warning(
                        "could not read job %s's cancel flag (%s); retrying", self.job_id, exc
                    )
                failing = True
                continue
            failing = False

    def _begin_pause(self) -> bool:
        try:
            return self.store.begin_pause(self.job_id, lease_token=self.lease_token)
        except FencedOut:
            return False  # the lease is gone: the watch loop's lease check ends the run


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


def _conclude(
    store: JobStore,
    retry: StoreRetry,
    job: JobRecord,
    lease: Lease,
    watch: _Watch,
    exitcode: int | None,
    oom_killed: bool,
    settings: Settings,
) -> _Outcome:
    """Record how the job ended. The job process sends its result only after its last event is
    in Redis, so `finish` always comes after the last step. Every write here is retried through
    a stall, but never past the lease: `LeaseLost` from `lease.check` ends the retries."""
    result = watch.result or {}
    outcome = result.get("outcome")
    lease.check()  # frozen past the lease while the job ended: not one write from here
    if outcome == "lease_lost":
        # The job process saw the lease lapse (or a write refused) before this worker did.
        message = f"the job process stopped: {result.get('message')}"
        raise LeaseLost(message, unreachable=bool(result.get("unreachable")))

    def call(what: str, fn: Callable[[], T]) -> T:
        return retry.call(f"{what} job {job.id}", fn, before_retry=lease.check)

    def say(message: str) -> None:
        publish_log_once(store.redis, retry, job.id, message, before_retry=lease.check)

    def fail(code: str, message: str, trace: str | None = None) -> _Outcome:
        say(f"failed ({code}): {message}")
        extra = {"error_code": code, "error_message": message}
        if trace:
            extra["error_traceback"] = trace
        call("finish", lambda: store.finish(job, "failed", extra))
        return _Outcome(f"failed: {code}")

    if outcome == "succeeded":
        extra = {"final_model": result["final_model"]} if result.get("final_model") else {}
        if result.get("warnings"):  # it learned nothing, say (`core.training.silence.run_warnings`)
            extra["warnings"] = json.dumps(result["warnings"])
        call("finish", lambda: store.finish(job, "succeeded", extra))
        return _Outcome(f"succeeded at step {result['step']}")
    if outcome == "failed":
        return fail(result["code"], result["message"], result.get("traceback"))
    if outcome == "missing":
        return _Outcome("missing")
    current = call("read", lambda: store.get(job.id))
    at = current.step if current is not None else 0
    if watch.reason == "cancel":
        how = "killed after the grace period" if watch.killed else f"at step {at}"
        say(f"cancelled ({how})")
        call("finish", lambda: store.finish(job, "cancelled"))
        return _Outcome(f"cancelled {how}")
    if watch.reason == "timeout":
        limit = timeout_seconds(job, settings) / 60
        message = (
            f"the job ran past its timeout of {limit:g} minutes and was stopped at step {at}; "
            "its checkpoints are kept"
        )
        return fail("timeout", message)
    if watch.reason == "shutdown":
        return _Outcome(f"stopped at step {at} for a worker shutdown", SHUTDOWN_REASON)
    if watch.reason == "pause":
        # handed back: the requeue script parks it as paused (or queues it, if the pause was
        # withdrawn meanwhile, or cancels it, if a cancel came): `ended_as` says which
        how = "killed after the grace period" if watch.killed else f"at step {at}"
        return _Outcome(f"stopped for a pause ({how})", PAUSE_REASON)
    if outcome == "stopped" and result.get("why") == "store_unreachable":
        why = (
            f"Redis was unreachable from the job for over {settings.store_outage_seconds:g}s; "
            f"stopped at step {result.get('step', at)} and queued again to resume from its last "
            "checkpoint"
        )
        return _Outcome(f"stopped at step {result.get('step', at)}: Redis unreachable", why)
    code, message = describe_exit(exitcode, oom_killed)
    log.error("job %s: %s", job.id, message)
    return fail(code, message)


def _tracking(settings: Settings, job: JobRecord) -> TrackingOptions:
    """Where the job's `train.report_to` reports (the operator's settings): its tracker runs
    are named after the job and tagged with it and its tenant."""
    return settings.tracking_options(job.id, {"pdppo.job": job.id, "pdppo.tenant": job.tenant})
