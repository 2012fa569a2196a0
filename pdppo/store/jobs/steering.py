"""Steering a job: change its settings while it runs (`PATCH`), pause it, resume it.

The job hash holds the cumulative change as `overrides` (a JSON merge patch of the spec) and its
`config_version`; the job process applies the newest version at its next step boundary and says
so with one `config` event (`Steering.announce`, fenced and once per version like every write of a
job process). Pausing follows cancelling: a queued job is paused on the spot and leaves the
outbox; a running one gets `pause_requested`, its worker stops it with a checkpoint where it
stops, losing no work (`core.training.trainer`: a step in its updates is finished first, the warm-up
is checkpointed too), and hands it back; the requeue script (`transitions.Requeue`) parks it
as `paused` instead of queueing it.
A paused job holds no worker and no lease but keeps its place in the tenant's active jobs.
Resuming puts it back in the queue and the outbox, so it always gets a task.

A job that failed for its disk (`storage_full`, `storage_error`: `core.disk.storage`) kept its
checkpoints and did nothing wrong of its own, so it may be resumed too, once space is back: the
one way a finished job changes again. It takes a place in the tenant's active jobs again (so it
is refused, `limit`, when they are full), loses its error and `finished_at`, and its stream says
`queued` after its `done`.

The scripts are `pdppo.store.jobs.transitions`' `Patch`, `Pause`, `Resume` and `Announce`; this
module chooses their values.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any, NamedTuple, cast

import redis
import redis.asyncio as aredis

from pdppo.store.jobs.events import log_data, status_data
from pdppo.store.jobs.outbox import DEFAULT_GRACE_SECONDS
from pdppo.store.jobs.records import JobRecord
from pdppo.store.jobs.transitions import Announce, Patch, Pause, Resume
from pdppo.store.keys import job_key, now_iso


class Paused(NamedTuple):
    """What a pause did, and the job as it left it (None: there is no job)."""

    outcome: str
    record: JobRecord | None


class AsyncSteering:
    """What the API does to steer a job, over the API's client."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client

    async def patch(
        self,
        job_id: str,
        base_version: int,
        overrides: dict[str, Any],
        total_steps: int | None,
        message: str,
        *,
        expected_versions: Collection[int] | None = None,
    ) -> tuple[str, str]:
        """Store the cumulative `overrides` as version `base_version + 1`, with `message` in the
        job's log: ('patched', new version), ('conflict', current version), ('precondition',
        current version: not one of `expected_versions`, the versions an If-Match names; None:
        no If-Match), ('terminal', status) or ('missing', '')."""
        return await Patch(
            job_id=job_id,
            base_version=base_version,
            overrides=json.dumps(overrides),
            now=now_iso(),
            total_steps="" if total_steps is None else total_steps,
            log_data=log_data(message),
            expected_versions=(  # an empty If-Match list matches nothing: -1 is no version
                "" if expected_versions is None else " ".join(map(str, expected_versions)) or "-1"
            ),
        ).arun(self.redis)

    async def pause(self, job_id: str) -> Paused:
        """'paused' (it was queued), 'requested' (running: it stops at its next checkpoint),
        'cancelling', 'already-<status>' or 'missing', with the job as the pause left it."""
        said, record = await Pause(
            job_id=job_id,
            now=now_iso(),
            paused_data=status_data("paused"),
            log_data=log_data(
                "pause requested; the job stops at the next step boundary (or warm-up step), "
                "checkpoints there and releases its worker; resume continues from there"
            ),
        ).arun(self.redis)
        return Paused(said, record)

    async def resume(
        self,
        job_id: str,
        dispatch_grace: float = DEFAULT_GRACE_SECONDS,
        tenant: str = "",
        max_active: int = 0,
    ) -> str:
        """'queued' (a paused job, or one failed for its disk; the caller sends its task, a
        dispatcher does if it dies first), 'withdrawn' (a pause not yet carried out is called
        off), 'limit' (failed for its disk, and `tenant` has `max_active` active jobs),
        'expired' (failed for its disk, but retention has deleted its checkpoints since),
        'already-<status>' or 'missing'."""
        return await Resume(
            job_id=job_id,
            tenant=tenant,
            now=now_iso(),
            queued_data=status_data("queued"),
            check_at=time.time() + dispatch_grace,
            withdrawn_log_data=log_data("pause withdrawn before the job stopped; it runs on"),
            max_active=max_active,
            storage_log_data=log_data(
                "resumed after failing for its disk; it continues from its latest checkpoint"
            ),
            stopping_log_data=log_data(
                "pause withdrawn after the job had begun stopping for it: it stops at its "
                "checkpoint as planned, then is queued again to run on from there"
            ),
        ).arun(self.redis)


class Steering:
    """What a job process reads and writes of its job's steering (sync client)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def config(self, job_id: str) -> tuple[int, dict[str, Any]]:
        """The job's config version and cumulative overrides (of the spec)."""
        version, overrides = cast(
            list[str | None], self.redis.hmget(job_key(job_id), ["config_version", "overrides"])
        )
        return int(version or 0), json.loads(overrides) if overrides else {}

    def announce(
        self, job_id: str, step: int, version: int, changes: dict[str, Any], *, lease_token: str
    ) -> bool:
        """The `config` event of `version`, applied from step `step + 1`; once per version."""
        data = json.dumps({"step": step, "version": version, "changes": changes})
        return Announce(job_id=job_id, version=version, event=data, lease_token=lease_token).run(
            self.redis
        )
