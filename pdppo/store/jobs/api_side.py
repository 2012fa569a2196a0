"""The job operations the API runs: create under the tenant's quota, read, list, cancel, fail.

Creating (quota and idempotency check, record, indexes, first event) and cancelling are each one Lua
script, defined next to the method that runs it, so a job is never half created or half cancelled
whoever crashes when; failing a job runs the worker's `_FINISH` script. The create script also puts
the job in the enqueue outbox (`pdppo.store.jobs.outbox`): the API publishes the task right after,
and if it dies first, a worker's dispatcher does, so a job that exists always gets a task;
cancelling a queued job takes it out again.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import redis.asyncio as aredis

from pdppo.store.experiments import AsyncExperimentStore
from pdppo.store.files import AsyncFileStore
from pdppo.store.jobs.events import AsyncEventStore, _log_data, _status_data
from pdppo.store.jobs.fair import FAIR
from pdppo.store.jobs.outbox import DEFAULT_GRACE_SECONDS
from pdppo.store.jobs.records import CreateResult, JobRecord, _record_or_none
from pdppo.store.jobs.steering import AsyncSteering
from pdppo.store.jobs.worker_side import _FINISH
from pdppo.store.keys import (
    OUTBOX,
    PREFIX,
    RUNNING_SET,
    WEBHOOK_FEED,
    events_key,
    idempotency_key,
    job_key,
    new_job_id,
    now_iso,
    spec_digest,
    tenant_active_key,
    tenant_jobs_key,
)
from pdppo.store.metadata import AsyncMetadataIndex
from pdppo.store.stats import COUNT_END, STATS
from pdppo.store.webhooks.endpoints import AsyncWebhookStore
from pdppo.store.webhooks.feed import FEED_EVENT

# KEYS: job, events, tenant jobs, tenant active, idempotency, outbox, webhook feed; ARGV: id, limit,
# idem ttl (0: no key), status data, outbox check time, then the hash's field/value pairs. The
# outbox entry is written with the record, so no crash can leave a job that nobody will ever
# enqueue.
_CREATE = """
if tonumber(ARGV[3]) > 0 then
  local existing = redis.call('GET', KEYS[5])
  if existing then return {'existing', existing} end
end
local active = redis.call('SCARD', KEYS[4])
if active >= tonumber(ARGV[2]) then return {'limit', tostring(active)} end
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[3], 0, ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[6], ARGV[5], ARGV[1])
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[3]) end
fair_enqueue(KEYS[1])
job_event(KEYS[2], KEYS[7], KEYS[1], 'status', ARGV[4])
return {'created', ARGV[1]}
"""
_CREATE = FAIR + FEED_EVENT + _CREATE

# KEYS: job, events, tenant active, running, outbox, stats, webhook feed; ARGV: id, now, status
# data, done
# data, log data. A queued or paused job is cancelled on the spot and leaves the outbox (a task
# already sent skips it when it arrives); a running one gets a flag its trainer checks every step.
_CANCEL = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if st == 'queued' or st == 'paused' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at', ARGV[2], 'updated_at', ARGV[2],
             'cancel_requested', '1')
  redis.call('SREM', KEYS[3], ARGV[1])
  redis.call('SREM', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
  fair_dropped(KEYS[1])
  job_event(KEYS[2], KEYS[7], KEYS[1], 'status', ARGV[3])
  redis.call('XADD', KEYS[2], '*', 'type', 'done', 'data', ARGV[4])
  count_end(KEYS[6], KEYS[1], 'cancelled')
  return 'cancelled-while-' .. st
end
if st == 'running' then
  if redis.call('HGET', KEYS[1], 'cancel_requested') ~= '1' then
    redis.call('HSET', KEYS[1], 'cancel_requested', '1', 'updated_at', ARGV[2])
    redis.call('XADD', KEYS[2], '*', 'type', 'log', 'data', ARGV[5])
  end
  return 'requested'
end
return 'already-' .. st
"""
_CANCEL = FAIR + COUNT_END + FEED_EVENT + _CANCEL


class AsyncJobStore:
    """What the API does to jobs, over `redis.asyncio` (decode_responses=True).

    It owns the client; the per-resource stores it builds (`events`, `files`) share it, and the
    event and metrics reads below delegate to them.
    """

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self.events = AsyncEventStore(client)
        self.files = AsyncFileStore(client)
        self.steering = AsyncSteering(client)
        self.webhooks = AsyncWebhookStore(client)
        self.metadata = AsyncMetadataIndex(client)
        self.experiments = AsyncExperimentStore(client)
        self._create = client.register_script(_CREATE)
        self._cancel = client.register_script(_CANCEL)
        self._finish = client.register_script(_FINISH)

    async def create(
        self,
        *,
        tenant: str,
        queue: str,
        name: str | None,
        spec_json: str,
        total_steps: int,
        max_active: int,
        idempotency: str | None,
        idempotency_ttl: int,
        dispatch_grace: float = DEFAULT_GRACE_SECONDS,
        job_id: str | None = None,
        openai_json: str | None = None,
        experiment: str | None = None,
    ) -> CreateResult:
        """Create the job under the quota, or find the one `idempotency` already made. A new job
        enters the outbox in the same script: if its task is not in the broker `dispatch_grace`
        seconds from now (the caller died before publishing it), a dispatcher publishes it.
        `job_id`: the id to give it (`new_job_id()`), chosen by a caller that must be able to
        name the job should the store not answer. `openai_json`: the OpenAI request that made
        it (`JobRecord.openai`). `experiment`: the experiment it is a child of."""
        job_id = job_id or new_job_id()
        now = now_iso()
        fields = {
            "id": job_id,
            "tenant": tenant,
            "status": "queued",
            "queue": queue,
            "name": name or "",
            "spec": spec_json,
            "spec_digest": spec_digest(spec_json),
            "created_at": now,
            "updated_at": now,
            "queued_at": now,
            "total_steps": str(total_steps),
            "attempts": "0",
        }
        if openai_json is not None:
            fields["openai"] = openai_json
        if experiment is not None:
            fields["experiment"] = experiment
        flat = [item for pair in fields.items() for item in pair]
        idem_key = idempotency_key(tenant, idempotency) if idempotency else f"{PREFIX}:idem:-"
        outcome, value = await self._create(
            keys=[
                job_key(job_id),
                events_key(job_id),
                tenant_jobs_key(tenant),
                tenant_active_key(tenant),
                idem_key,
                OUTBOX,
                WEBHOOK_FEED,
            ],
            args=[
                job_id,
                max_active,
                idempotency_ttl if idempotency else 0,
                _status_data("queued"),
                time.time() + dispatch_grace,
                *flat,
            ],
        )
        if outcome == "limit":
            return CreateResult("limit", None, int(value))
        if outcome == "created":
            return CreateResult(outcome, value, record=JobRecord.from_hash(fields))
        return CreateResult(outcome, value)

    async def get(self, job_id: str) -> JobRecord | None:
        raw = await self.redis.hgetall(job_key(job_id))
        return _record_or_none(cast(dict[str, str], raw))

    async def idempotent_job(self, tenant: str, key: str) -> JobRecord | None:
        """The job `key` (an Idempotency-Key of `tenant`) made, while the key lives; None when
        it made none (or the job is deleted)."""
        job_id = await self.redis.get(idempotency_key(tenant, key))
        return await self.get(str(job_id)) if job_id else None

    async def list_jobs(
        self, tenant: str, *, limit: int, cursor: str | None, status: str | None
    ) -> tuple[list[JobRecord], str | None]:
        """Newest first from the tenant's index, filtered; the cursor is the last id returned."""
        if status in ("queued", "running", "paused"):
            return await self._list_active(tenant, limit=limit, cursor=cursor, status=status)
        key = tenant_jobs_key(tenant)
        out: list[JobRecord] = []
        upper = f"({cursor}" if cursor else "+"
        batch = max(limit, 50) if status else limit
        while True:
            found = await self.redis.zrevrangebylex(key, upper, "-", start=0, num=batch)
            ids = cast(list[str], found)
            pipe = self.redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(job_key(job_id))
            for job_id, raw in zip(ids, await pipe.execute(), strict=True):
                upper = f"({job_id}"
                record = _record_or_none(raw)
                if record is None or (status is not None and record.status != status):
                    continue
                out.append(record)
                if len(out) == limit:
                    more = await self.redis.zrevrangebylex(key, upper, "-", start=0, num=1)
                    return out, (job_id if more else None)
            if len(ids) < batch:
                return out, None

    async def _list_active(
        self, tenant: str, *, limit: int, cursor: str | None, status: str
    ) -> tuple[list[JobRecord], str | None]:
        """Queued, running or paused jobs come from the small active set (bounded by the quota), not
        from a scan of the tenant's whole history."""
        members = cast(set[str], await self.redis.smembers(tenant_active_key(tenant)))
        ids = sorted((i for i in members if cursor is None or i < cursor), reverse=True)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(job_key(job_id))
        records = [_record_or_none(raw) for raw in await pipe.execute()]
        matching = [r for r in records if r is not None and r.status == status]
        page = matching[:limit]
        return page, (page[-1].id if len(matching) > limit else None)

    async def cancel(self, job_id: str) -> str:
        """'cancelled-while-queued' (or -paused), 'requested' (running), 'already-<status>' or
        'missing'."""
        record = await self.get(job_id)
        if record is None:
            return "missing"
        outcome = await self._cancel(
            keys=[
                job_key(job_id),
                events_key(job_id),
                tenant_active_key(record.tenant),
                RUNNING_SET,
                OUTBOX,
                STATS,
                WEBHOOK_FEED,
            ],
            args=[
                job_id,
                now_iso(),
                _status_data("cancelled"),
                json.dumps({"status": "cancelled"}),
                _log_data(
                    "cancel requested; the job stops within seconds, keeping its last checkpoint"
                ),
            ],
        )
        return str(outcome)

    async def fail(self, job: JobRecord, code: str, message: str) -> bool:
        keys = [
            job_key(job.id),
            events_key(job.id),
            tenant_active_key(job.tenant),
            RUNNING_SET,
            OUTBOX,
            STATS,
            WEBHOOK_FEED,
        ]
        args = [
            job.id,
            "failed",
            now_iso(),
            _status_data("failed"),
            json.dumps({"status": "failed"}),
        ]
        extra = ["error_code", code, "error_message", message]
        return bool(await self._finish(keys=keys, args=[*args, *extra]))

    async def metrics_history(self, job_id: str) -> list[dict[str, Any]]:
        return await self.events.metrics_history(job_id)

    async def last_event_id(self, job_id: str) -> str:
        return await self.events.last_event_id(job_id)
