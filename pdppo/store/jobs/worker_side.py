"""The job operations a worker runs while it holds a job: claim, publish, finish, requeue.

A thin front end of `pdppo.store.jobs.transitions`, where each of these changes is one Lua script
with the typed call that runs it: this module chooses the values (now, the events' data, the
messages) and answers in the workers' terms. A job process passes its claim's lease token with
every write, and a write whose token no longer holds the lease raises `FencedOut`
(docs/developers/design.md#fencing).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis

from pdppo.store.jobs.clock import gap_and_hold_ms
from pdppo.store.jobs.events import EventStore, log_data, status_data
from pdppo.store.jobs.fair import FairQueue
from pdppo.store.jobs.outbox import DEFAULT_GRACE_SECONDS, Outbox
from pdppo.store.jobs.records import JobRecord, record_or_none
from pdppo.store.jobs.transitions import (
    STALE,
    AddLogOnce,
    BeginPause,
    Claim,
    FencedOut,
    Finish,
    PublishCheckpoint,
    PublishPhase,
    PublishResult,
    PublishStep,
    PublishTrackers,
    Requeue,
)
from pdppo.store.keys import RUNNING_SET, eval_key, job_key, now_iso, samples_key
from pdppo.store.retry import LOG_RECOVERY_WINDOW

__all__ = ["SAMPLES_KEPT", "STALE", "STARTING_PHASE", "FencedOut", "JobStore"]

STARTING_PHASE = json.dumps({"name": "loading model", "done": None, "total": None})
"""A claimed job's phase until its trainer tells its own (`core.training.callbacks.PHASES`)."""

SAMPLES_KEPT = 1000
"""Newest `samples` rows a job keeps for `GET /v1/jobs/{id}/samples` (each up to
log_samples_count triples of a few KB): samples show what the model writes now, not a full
history, and a long run logging every step must not grow Redis without bound."""


class JobStore:
    """What the workers do to jobs, over the synchronous client (decode_responses=True).

    It owns the client; the per-resource stores it builds (`events`, `outbox`) share it.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self.events = EventStore(client)
        self.outbox = Outbox(client)
        self.fair = FairQueue(client)

    def get(self, job_id: str) -> JobRecord | None:
        return record_or_none(cast(dict[str, str], self.redis.hgetall(job_key(job_id))))

    def claim(self, job_id: str, worker: str) -> bool:
        return Claim(
            job_id=job_id,
            now=now_iso(),
            worker=worker,
            status_data=status_data("running"),
            phase=STARTING_PHASE,
        ).run(self.redis)

    def stop_flags(self, job_id: str) -> tuple[bool, bool]:
        """(cancel requested, pause requested), in one round trip."""
        cancel, pause = cast(
            list[str | None],
            self.redis.hmget(job_key(job_id), ["cancel_requested", "pause_requested"]),
        )
        return cancel == "1", pause == "1"

    def begin_pause(self, job_id: str, *, lease_token: str) -> bool:
        """The job's pending pause is being carried out (True), or there is none to carry out
        (False: withdrawn meanwhile, a cancel pending, the job not running). `FencedOut` when
        `lease_token` no longer holds the job's lease."""
        return BeginPause(job_id=job_id, lease_token=lease_token).run(self.redis)

    def publish_step(
        self,
        job_id: str,
        step: int,
        total: int,
        metrics: dict[str, float],
        *,
        lease_token: str = "",
    ) -> bool:
        """Step `step`'s metrics, once; `lease_token`: the writer's claim (a job process always
        passes it), whose lease must still be held (`FencedOut` otherwise)."""
        return PublishStep(
            job_id=job_id,
            step=step,
            now=now_iso(),
            metrics=json.dumps(metrics),
            event=json.dumps({"step": step, "total": total, "metrics": metrics}),
            row=json.dumps({"step": step, "metrics": metrics}),
            lease_token=lease_token,
        ).run(self.redis)

    def publish_checkpoint(
        self, job_id: str, step: int, name: str, *, lease_token: str = ""
    ) -> bool:
        """Checkpoint `name` of step `step`, once; False when the job is no longer running (or
        the step is not past the last one recorded)."""
        return PublishCheckpoint(
            job_id=job_id,
            step=step,
            now=now_iso(),
            event=json.dumps({"step": step, "name": name}),
            lease_token=lease_token,
        ).run(self.redis)

    def publish_eval(
        self,
        job_id: str,
        step: int,
        total: int,
        metrics: dict[str, float],
        *,
        lease_token: str = "",
    ) -> bool:
        """The held-out evaluation after `step`: an `eval` event and a row of `/eval`, once."""
        return PublishResult(
            job_id=job_id,
            rows_key=eval_key(job_id),
            step=step,
            now=now_iso(),
            event=json.dumps({"step": step, "total": total, "metrics": metrics}),
            row=json.dumps({"step": step, "metrics": metrics}),
            step_field="eval_step",
            event_type="eval",
            keep=0,  # every row: the curve `/eval` serves
            lease_token=lease_token,
            what="evaluation",
        ).run(self.redis)

    def publish_samples(
        self,
        job_id: str,
        step: int,
        samples: Sequence[Mapping[str, Any]],
        *,
        lease_token: str = "",
    ) -> bool:
        """A few triples of `step`'s rollout: a `samples` event and a row of `/samples`, once."""
        data = json.dumps({"step": step, "samples": list(samples)})
        return PublishResult(
            job_id=job_id,
            rows_key=samples_key(job_id),
            step=step,
            now=now_iso(),
            event=data,
            row=data,
            step_field="samples_step",
            event_type="samples",
            keep=SAMPLES_KEPT,
            lease_token=lease_token,
            what="samples",
        ).run(self.redis)

    def publish_phase(
        self,
        job_id: str,
        name: str,
        done: int | None,
        total: int | None,
        *,
        at: str,
        lease_token: str = "",
    ) -> bool:
        """The phase the job entered (or its progress in it), stamped `at` when the trainer
        said it; False when the job is no longer running."""
        phase = {"name": name, "done": done, "total": total}
        return PublishPhase(
            job_id=job_id,
            name=name,
            phase=json.dumps(phase),
            event=json.dumps({**phase, "at": at}),
            at=at,
            lease_token=lease_token,
        ).run(self.redis)

    def publish_trackers(
        self, job_id: str, runs: dict[str, dict[str, str]], *, lease_token: str = ""
    ) -> bool:
        """The tracker runs ({tracker: {run_id, url}}) the job reports to, into its record;
        False when the job is no longer running."""
        return PublishTrackers(job_id=job_id, runs=json.dumps(runs), lease_token=lease_token).run(
            self.redis
        )

    def add_log_once(self, job_id: str, fields: dict[str, str], *, lease_token: str) -> bool:
        """A job process's `log` entry (`pdppo.store.retry.log_fields`), added once however often
        it is retried (False: it was there already), and only while `lease_token` holds the
        lease (`FencedOut` otherwise). One attempt: the caller retries."""
        return AddLogOnce(
            job_id=job_id,
            type=fields["type"],
            data=fields["data"],
            window=LOG_RECOVERY_WINDOW,
            lease_token=lease_token,
        ).run(self.redis)

    def publish_log(self, job_id: str, message: str) -> None:
        self.events.publish_log(job_id, message)

    def finish(self, job: JobRecord, status: str, extra: dict[str, str] | None = None) -> bool:
        return Finish(
            job_id=job.id,
            tenant=job.tenant,
            status=status,
            now=now_iso(),
            status_data=status_data(status),
            done_data=json.dumps({"status": status}),
            fields=extra or {},
        ).run(self.redis)

    def running_job_ids(self) -> list[str]:
        return sorted(cast(set[str], self.redis.smembers(RUNNING_SET)))

    def requeue_if_orphaned(
        self,
        job: JobRecord,
        reason: str = "worker lost; queued again to resume from its last checkpoint",
        lease_token: str = "",
        max_worker_losses: int = 0,
        dispatch_grace: float = DEFAULT_GRACE_SECONDS,
        lease_seconds: float | None = None,
    ) -> str:
        """'requeued' (the caller must send the task again), 'cancelled' (a cancel was pending),
        'paused' (a pause was: it waits for `resume`),
        'failed' (more than `max_worker_losses` workers died on it; 0: no limit), 'leased' (its
        worker is alive), 'held' (Redis was just away, `pdppo.store.jobs.clock`: a reaper
        leaves the job to its holder a while) or 'not-running'. The lease holder passes its
        token to hand the job back without a window where a reaper could take it first (that is
        no worker loss). A requeued job enters the outbox: if its task is not seen in the broker
        `dispatch_grace` seconds from now (the caller died before sending it), a dispatcher sends
        it. `lease_seconds` (the service's): stamp the store's clock, and hold as above; None:
        neither."""
        gap, hold = gap_and_hold_ms(lease_seconds) if lease_seconds is not None else ("", "")
        return Requeue(
            job_id=job.id,
            tenant=job.tenant,
            now=now_iso(),
            queued_data=status_data("queued"),
            log_data=log_data(reason),
            cancelled_data=status_data("cancelled"),
            cancelled_done_data=json.dumps({"status": "cancelled"}),
            lease_token=lease_token,
            max_worker_losses=max_worker_losses,
            failed_data=status_data("failed"),
            failed_done_data=json.dumps({"status": "failed"}),
            failure_message=(
                f"the job's worker died {max_worker_losses + 1} times while running it "
                "(killed, out of memory, or lost its machine); not retried again"
            ),
            check_at=time.time() + dispatch_grace,
            paused_data=status_data("paused"),
            paused_log_data=log_data(
                f"paused at step {self.get_step(job.id)}; resume it with POST "
                f"/v1/jobs/{job.id}/resume (pdppo resume {job.id}) to continue from its "
                "last checkpoint"
            ),
            stall_gap_ms=gap,
            stall_hold_ms=hold,
        ).run(self.redis)

    def get_step(self, job_id: str) -> int:
        return int(cast(str | None, self.redis.hget(job_key(job_id), "step")) or 0)
