"""Steering a job: change its settings while it runs (`PATCH`), pause it, resume it.

The job hash holds the cumulative change as `overrides` (a JSON merge patch of the spec) and its
`config_version`; the job process applies the newest version at its next step boundary and says
so with one `config` event (`Steering.announce`, fenced and once per version like every write of a
job process). Pausing follows cancelling: a queued job is paused on the spot and leaves the
outbox; a running one gets `pause_requested`, its worker stops it with a checkpoint where it
stops, losing no work (`core.training.trainer`: a step in its updates is finished first, the warm-up
is checkpointed too), and hands it back; the requeue script (`jobs_worker._REQUEUE`) parks it as
`paused` instead of queueing it.
A paused job holds no worker and no lease but keeps its place in the tenant's active jobs.
Resuming puts it back in the queue and the outbox, so it always gets a task.

A job that failed for its disk (`storage_full`, `storage_error`: `core.disk.storage`) kept its
checkpoints and did nothing wrong of its own, so it may be resumed too, once space is back: the
one way a finished job changes again. It takes a place in the tenant's active jobs again (so it
is refused, `limit`, when they are full), loses its error and `finished_at`, and its stream says
`queued` after its `done`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any, NamedTuple, cast

import redis
import redis.asyncio as aredis

from pdppo.store.jobs.events import _log_data, _status_data
from pdppo.store.jobs.fair import FAIR
from pdppo.store.jobs.outbox import DEFAULT_GRACE_SECONDS
from pdppo.store.jobs.records import JobRecord, _record_or_none
from pdppo.store.jobs.worker_side import _checked, _fenced
from pdppo.store.keys import (
    OUTBOX,
    WEBHOOK_FEED,
    events_key,
    job_key,
    lease_key,
    now_iso,
    tenant_active_key,
)
from pdppo.store.webhooks.feed import FEED_EVENT

# KEYS: job, events; ARGV (`AsyncSteering.patch` names them): base_version (the version the change
# was computed from), overrides json, now, total_steps (new total steps, '' for unchanged), log
# data, expected_versions (the versions the client's If-Match names, space-separated; '' for no
# If-Match). Compare-and-set on the version: two concurrent changes never lose one another (the
# loser computes again from the winner's overrides). The If-Match precondition is checked here,
# with the write, so that a retried change whose first attempt landed meanwhile is refused, not
# made over the first (`precondition`, the route's 412).
_PATCH = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing', ''} end
if st == 'succeeded' or st == 'failed' or st == 'cancelled' then return {'terminal', st} end
local v = tonumber(redis.call('HGET', KEYS[1], 'config_version') or '0')
if ARGV[6] ~= '' then
  local matched = false
  for expected in string.gmatch(ARGV[6], '%S+') do
    if tonumber(expected) == v then matched = true end
  end
  if not matched then return {'precondition', tostring(v)} end
end
if v ~= tonumber(ARGV[1]) then return {'conflict', tostring(v)} end
redis.call('HSET', KEYS[1], 'overrides', ARGV[2], 'config_version', v + 1, 'updated_at', ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'total_steps', ARGV[4]) end
redis.call('XADD', KEYS[2], '*', 'type', 'log', 'data', ARGV[5])
return {'patched', tostring(v + 1)}
"""

# KEYS: job, events, outbox, webhook feed; ARGV: now, paused data, log data. Returns {outcome,
# the job's hash as the script left it}: the API answers with that hash, not one read after, which
# a worker carrying the pause out (or a resume) may have changed meanwhile.
_PAUSE = """
local function outcome()
  local st = redis.call('HGET', KEYS[1], 'status')
  if not st then return 'missing' end
  if st == 'queued' then
    redis.call('HSET', KEYS[1], 'status', 'paused', 'updated_at', ARGV[1])
    redis.call('ZREM', KEYS[3], redis.call('HGET', KEYS[1], 'id'))
    fair_dropped(KEYS[1])
    job_event(KEYS[2], KEYS[4], KEYS[1], 'status', ARGV[2])
    return 'paused'
  end
  if st == 'running' then
    if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return 'cancelling' end
    if redis.call('HGET', KEYS[1], 'pause_requested') ~= '1' then
      redis.call('HSET', KEYS[1], 'pause_requested', '1', 'updated_at', ARGV[1])
      redis.call('XADD', KEYS[2], '*', 'type', 'log', 'data', ARGV[3])
    end
    return 'requested'
  end
  return 'already-' .. st
end
local said = outcome()
return {said, redis.call('HGETALL', KEYS[1])}
"""
_PAUSE = FAIR + FEED_EVENT + _PAUSE

# KEYS: job, events, outbox, tenant active, webhook feed; ARGV: now, queued data, outbox check
# time, log data of a pause withdrawn, most active jobs of the tenant, log data of a failed job
# resumed, log data of a pause withdrawn once its worker had begun stopping the job for it
# (`pause_stopping`, `JobStore.begin_pause`): that job stops anyway, and is queued again.
_RESUME = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
local code = redis.call('HGET', KEYS[1], 'error_code')
if st == 'failed' and (code == 'storage_full' or code == 'storage_error') then
  if redis.call('HEXISTS', KEYS[1], 'artifacts_expired_at') == 1 then return 'expired' end
  if redis.call('SCARD', KEYS[4]) >= tonumber(ARGV[5]) then return 'limit' end
  local id = redis.call('HGET', KEYS[1], 'id')
  redis.call('HSET', KEYS[1], 'status', 'queued', 'updated_at', ARGV[1], 'queued_at', ARGV[1])
  redis.call('HDEL', KEYS[1], 'finished_at', 'error_code', 'error_message', 'error_traceback')
  redis.call('SADD', KEYS[4], id)
  redis.call('ZADD', KEYS[3], ARGV[3], id)
  fair_enqueue(KEYS[1])
  redis.call('XADD', KEYS[2], '*', 'type', 'log', 'data', ARGV[6])
  job_event(KEYS[2], KEYS[5], KEYS[1], 'status', ARGV[2])
  return 'queued'
end
if st == 'paused' then
  redis.call('HSET', KEYS[1], 'status', 'queued', 'updated_at', ARGV[1], 'queued_at', ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[3], redis.call('HGET', KEYS[1], 'id'))
  fair_enqueue(KEYS[1])
  job_event(KEYS[2], KEYS[5], KEYS[1], 'status', ARGV[2])
  return 'queued'
end
if st == 'running' and redis.call('HGET', KEYS[1], 'pause_requested') == '1' then
  redis.call('HDEL', KEYS[1], 'pause_requested')
  local said = ARGV[4]
  if redis.call('HGET', KEYS[1], 'pause_stopping') == '1' then said = ARGV[7] end
  redis.call('XADD', KEYS[2], '*', 'type', 'log', 'data', said)
  return 'withdrawn'
end
return 'already-' .. st
"""
_RESUME = FAIR + FEED_EVENT + _RESUME

# KEYS: job, events, lease; ARGV: version, event data, lease token. A job process's `config`
# event, once per version, only while it holds the lease.
_ANNOUNCE = """
local last = tonumber(redis.call('HGET', KEYS[1], 'config_applied') or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('HSET', KEYS[1], 'config_applied', ARGV[1])
redis.call('XADD', KEYS[2], '*', 'type', 'config', 'data', ARGV[2])
return 1
"""
_ANNOUNCE = _fenced(_ANNOUNCE, lease=3, token=3)


class Paused(NamedTuple):
    """What a pause did, and the job as it left it (None: there is no job)."""

    outcome: str
    record: JobRecord | None


class AsyncSteering:
    """What the API does to steer a job, over the API's client."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._patch = client.register_script(_PATCH)
        self._pause = client.register_script(_PAUSE)
        self._resume = client.register_script(_RESUME)

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
        args: dict[str, str | int] = {
            "base_version": base_version,
            "overrides": json.dumps(overrides),
            "now": now_iso(),
            "total_steps": "" if total_steps is None else total_steps,
            "log": _log_data(message),
            "expected_versions": (  # an empty If-Match list matches nothing: -1 is no version
                "" if expected_versions is None else " ".join(map(str, expected_versions)) or "-1"
            ),
        }
        outcome, value = await self._patch(
            keys=[job_key(job_id), events_key(job_id)], args=list(args.values())
        )
        return str(outcome), str(value)

    async def pause(self, job_id: str) -> Paused:
        """'paused' (it was queued), 'requested' (running: it stops at its next checkpoint),
        'cancelling', 'already-<status>' or 'missing', with the job as the pause left it."""
        said, fields = await self._pause(
            keys=[job_key(job_id), events_key(job_id), OUTBOX, WEBHOOK_FEED],
            args=[
                now_iso(),
                _status_data("paused"),
                _log_data(
                    "pause requested; the job stops at the next step boundary (or warm-up step), "
                    "checkpoints there and releases its worker; resume continues from there"
                ),
            ],
        )
        raw = dict(zip(fields[::2], fields[1::2], strict=True))
        return Paused(str(said), _record_or_none(raw))

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
        result = await self._resume(
            keys=[
                job_key(job_id),
                events_key(job_id),
                OUTBOX,
                tenant_active_key(tenant),
                WEBHOOK_FEED,
            ],
            args=[
                now_iso(),
                _status_data("queued"),
                time.time() + dispatch_grace,
                _log_data("pause withdrawn before the job stopped; it runs on"),
                max_active,
                _log_data(
                    "resumed after failing for its disk; it continues from its latest checkpoint"
                ),
                _log_data(
                    "pause withdrawn after the job had begun stopping for it: it stops at its "
                    "checkpoint as planned, then is queued again to run on from there"
                ),
            ],
        )
        return str(result)


class Steering:
    """What a job process reads and writes of its job's steering (sync client)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._announce = client.register_script(_ANNOUNCE)

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
        keys = [job_key(job_id), events_key(job_id), lease_key(job_id)]
        result = self._announce(keys=keys, args=[version, data, lease_token])
        return _checked(job_id, f"config {version}", result)
