"""Repairs what a dead process left behind: orphaned running jobs, and queued jobs with no task.

The reaper finds running jobs whose worker died (lease expired) and queues them again to resume.
Celery alone would redeliver the dead worker's task only after `visibility_timeout` (an hour), and
a copy it redelivered earlier may already have been dropped by the lease check; so every worker
runs this loop. The requeue is one Lua script that also flips the job to `queued`, so of several
reapers exactly one re-sends the task.

The dispatcher drains the enqueue outbox (`pdppo.store.jobs.outbox`): a queued job whose task its
creator (the API, a reaper, a worker handing a job back) died before publishing, or whose task a
worker took and died with before claiming the job, gets its task back within seconds. It runs in
every worker rather than in the API because a job can only run where a worker runs: with no
worker up, nothing is lost by waiting, and the first worker to start repairs everything (it also
adopts queued jobs that predate the outbox). Each check looks at the broker first, so a job that
is merely waiting its turn behind others is never re-sent, and a task is sent again only when no
copy of it is waiting or held by a live worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from pdppo.settings import Settings
from pdppo.store import RUNNING_SET, JobStore, job_key
from pdppo.store.jobs.clock import tick as clock_tick
from pdppo.store.jobs.outbox import DEFAULT_GRACE_SECONDS
from pdppo.store.stats import TALLY
from workers.celery_app import broker_view, enqueue, restore_taken, task_priority
from workers.upkeep.heartbeat import Heartbeat
from workers.upkeep.outage_log import OutageLog

log = logging.getLogger(__name__)
# How long a task seen nowhere in the broker is looked for once more before it is sent again.
CONFIRM_SECONDS = 0.5
# What a reaper pass did to an orphaned job, counted (`pdppo_reconciler_actions_total`); with
# the dispatcher's `task_sent` and `task_restored`. 'leased' and 'not-running' did nothing.
RECONCILER_ACTIONS = ("requeued", "failed", "cancelled", "paused")


@dataclass(frozen=True)
class DispatchTiming:
    """When the dispatcher looks at an outbox entry (seconds)."""

    grace: float  # after a job is created, requeued or its task re-sent: time to publish it
    claim_grace: float  # a task taken longer ago than this without a claim: its taker died
    recheck: float  # a job waiting in a queue is looked at again after this

    @classmethod
    def from_settings(cls, settings: Settings) -> DispatchTiming:
        """A taker is presumed dead after a lease period, like a running job's worker (and as
        long as a worker riding out a Redis stall may take to claim); a waiting job is looked
        at every few graces, which bounds how often a dispatcher reads a whole queue."""
        grace = settings.outbox_grace_seconds
        claim_grace = max(grace, settings.lease_seconds)
        return cls(grace=grace, claim_grace=claim_grace, recheck=max(6 * grace, claim_grace))

    @property
    def interval(self) -> float:
        return min(1.0, self.grace / 2)


def reap_once(
    store: JobStore,
    max_worker_losses: int,
    dispatch_grace: float = DEFAULT_GRACE_SECONDS,
    lease_seconds: float | None = None,
) -> list[str]:
    """Requeue every orphaned running job, or fail it past `max_worker_losses` (0: no limit; the
    server's setting, so no default here); returns the ids sent again. A requeued job is in the
    outbox, so if this reaper dies before sending, a dispatcher sends it `dispatch_grace` later.
    `lease_seconds` (the service's): right after Redis was away, leave each orphan to its holder
    for a while (`pdppo.store.jobs.clock`: its lease may have expired under a live holder)."""
    sent: list[str] = []
    for job_id in store.running_job_ids():
        job = store.get(job_id)
        if job is None:
            store.redis.srem(RUNNING_SET, job_id)
            continue
        outcome = store.requeue_if_orphaned(
            job,
            max_worker_losses=max_worker_losses,
            dispatch_grace=dispatch_grace,
            lease_seconds=lease_seconds,
        )
        if outcome == "held":
            log.info("job %s: its lease expired while Redis was away; left to its holder", job.id)
        if outcome in RECONCILER_ACTIONS:
            TALLY.add("reconciler", outcome)
        if outcome == "failed":
            log.error("job %s lost its worker too often; marked failed", job.id)
        if outcome == "requeued":
            enqueue(job.id, job.queue, task_priority(job.experiment))
            log.warning("job %s lost its worker; queued again on %s", job.id, job.queue)
            sent.append(job.id)
    return sent


def dispatch_once(store: JobStore, timing: DispatchTiming, now: float | None = None) -> list[str]:
    """Check the outbox entries that are due; returns the ids whose task was sent or put back.

    Per due job: waiting in its queue, nothing (looked at again after `recheck`); taken by a
    worker less than `claim_grace` ago, looked at again when that runs out; taken longer ago
    (the worker died before claiming it), the message goes back to the head of its queue; no
    message anywhere, the task is sent. Taking an entry moves its next check forward, so of
    several dispatchers exactly one acts on it."""
    now = time.time() if now is None else now
    due = store.outbox.take_due(timing.recheck, now=now)
    if not due:
        return []
    view = broker_view(store.redis, {queue for _, queue in due})
    acted: list[str] = []
    missing: list[tuple[str, str]] = []
    for job_id, queue in due:
        if job_id in view.waiting:
            continue
        latest = view.latest(job_id)
        if latest is None:
            missing.append((job_id, queue))
        elif now - latest.at < timing.claim_grace:
            store.outbox.check_at(job_id, latest.at + timing.claim_grace)
        else:
            restore_taken(latest.tag)
            TALLY.add("reconciler", "task_restored")
            store.outbox.check_at(job_id, now + timing.grace)
            acted.append(job_id)
            log.warning(
                "job %s: its task was taken %.0fs ago by a worker that never claimed the job; "
                "put back in queue %s",
                job_id,
                now - latest.at,
                queue,
            )
    return acted + _send_missing(store, timing, missing)


def _send_missing(
    store: JobStore, timing: DispatchTiming, missing: list[tuple[str, str]]
) -> list[str]:
    """Send the tasks of queued jobs seen nowhere in the broker, after one more look: a consumer
    takes a message (`BRPOP`) and records it in `unacked` a moment later, so a task seen nowhere
    may just be in between, and sending it then would deliver the job twice."""
    if not missing:
        return []
    time.sleep(CONFIRM_SECONDS)
    view = broker_view(store.redis, {queue for _, queue in missing})
    pipe = store.redis.pipeline(transaction=False)
    for job_id, _ in missing:
        pipe.hmget(job_key(job_id), ["status", "experiment"])
    sent: list[str] = []
    for (job_id, queue), (status, experiment) in zip(missing, pipe.execute(), strict=True):
        if status != "queued" or job_id in view.waiting:
            continue  # claimed meanwhile (which took it out of the outbox), or waiting after all
        latest = view.latest(job_id)
        if latest is not None:
            store.outbox.check_at(job_id, latest.at + timing.claim_grace)
            continue
        enqueue(job_id, queue, task_priority(experiment))
        TALLY.add("reconciler", "task_sent")
        store.outbox.check_at(job_id, time.time() + timing.grace)
        sent.append(job_id)
        log.warning("job %s was queued with no task (its sender died); sent to %s", job_id, queue)
    return sent


def start_reaper(
    store: JobStore,
    *,
    interval: float,
    max_worker_losses: int,
    outage_hold: float,
    timing: DispatchTiming | None = None,
    heartbeat: Heartbeat | None = None,
    lease_seconds: float | None = None,
) -> threading.Event:
    """Runs `reap_once` every `interval` seconds in a daemon thread, and with `timing`
    `dispatch_once` every `timing.interval` (after adopting queued jobs that predate the
    outbox); set the event to stop. The policy comes from the server's settings
    (`workers.tasks`), so none of it has a default here.

    After this reaper could not reach Redis, it waits `outage_hold` seconds (a lease period)
    before reaping again: every lease expired during the outage, but their holders are alive
    and hand their jobs back themselves, saying why; a reaper that got there first would call
    each a lost worker and count it towards failing the job.

    `heartbeat` beats after every dispatcher pass, each of which reached Redis: the worker's
    healthcheck reads it (`workers.upkeep.heartbeat`).

    `lease_seconds` (the service's): every pass stamps the store's clock and every requeue holds
    after a stall that the store saw (`pdppo.store.jobs.clock`), which covers what this
    reaper's own hold cannot: a stall that its own calls happened to miss."""
    stop = threading.Event()
    grace = DEFAULT_GRACE_SECONDS if timing is None else timing.grace
    outage = {"failed": False, "hold_until": 0.0}

    def reap() -> None:
        if time.monotonic() < outage["hold_until"]:
            return
        asked = time.monotonic()
        try:
            store.redis.ping()  # a stall shows here as a slow answer, an outage as an error
            stalled = time.monotonic() - asked > interval
            if outage["failed"] or stalled:
                outage["failed"] = False
                outage["hold_until"] = time.monotonic() + outage_hold
                log.warning("Redis was unreachable; reaping again in %.0fs", outage_hold)
                return
            reap_once(store, max_worker_losses, grace, lease_seconds)
        except redis.RedisError:
            outage["failed"] = True
            raise

    outages: dict[str, OutageLog] = {}

    def guarded(what: str, action: Callable[[], object]) -> bool:
        outage_log = outages.setdefault(what, OutageLog(what, log))
        try:
            action()
            outage_log.reached()
            return True
        except redis.RedisError as exc:
            outage_log.failed(exc)
        except Exception:
            log.exception("%s failed; retrying", what)
        return False

    def adopt() -> None:
        if added := store.outbox.adopt_queued():
            log.warning("%d queued jobs had no outbox entry; the dispatcher checks them", added)

    def dispatch(timing: DispatchTiming) -> None:
        if lease_seconds is not None:
            clock_tick(store.redis, lease_seconds)  # every second or so, while Redis answers
        dispatch_once(store, timing)

    def loop() -> None:
        tick = interval if timing is None else min(interval, timing.interval)
        next_reap = time.monotonic() + interval
        adopted = timing is None or guarded("outbox adoption", adopt)
        while not stop.wait(tick):
            if time.monotonic() >= next_reap:
                next_reap = time.monotonic() + interval
                guarded("reaper", reap)
            if timing is not None:
                adopted = adopted or guarded("outbox adoption", adopt)
                passed = guarded("dispatcher", lambda: dispatch(timing))
                if passed and heartbeat is not None:
                    heartbeat.beat()

    threading.Thread(target=loop, name="pdppo reaper", daemon=True).start()
    return stop
