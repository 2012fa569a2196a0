"""The Redis job store shared by the API (asyncio) and the workers (threads).

Per job: a hash (the job record: status, timestamps, tenant, spec, progress, latest metrics,
error), a stream of events (what SSE serves; entry ids are the SSE ids), a list of metrics rows
(what `/metrics` serves) and a lease key. Per tenant: a sorted set of job ids for listing and a
set of active (queued or running) ids for the quota. Every state change that must not race (create
under the quota, claim, publish a step, finish, cancel, requeue) is one Lua script, so the record,
the indexes and the event stream never disagree, whoever crashes when.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import redis
import redis.asyncio as aredis

PREFIX = "pdppo"
RUNNING_SET = f"{PREFIX}:running"
TERMINAL = ("succeeded", "failed", "cancelled")


def job_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def events_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:events"


def metrics_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:metrics"


def lease_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:lease"


def tenant_jobs_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:jobs"


def tenant_active_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:active"


def idempotency_key(tenant: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{PREFIX}:idem:{tenant}:{digest}"


def new_job_id() -> str:
    """Time-ordered ids (ms timestamp, then randomness) so that listing by id is newest first."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def spec_digest(spec_json: str) -> str:
    return hashlib.sha256(spec_json.encode()).hexdigest()


# KEYS: job, events, tenant jobs, tenant active, idempotency; ARGV: id, limit, idem ttl (0: no
# key), status data, then the hash's field/value pairs.
_CREATE = """
if tonumber(ARGV[3]) > 0 then
  local existing = redis.call('GET', KEYS[5])
  if existing then return {'existing', existing} end
end
local active = redis.call('SCARD', KEYS[4])
if active >= tonumber(ARGV[2]) then return {'limit', tostring(active)} end
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[3], 0, ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[3]) end
redis.call('XADD', KEYS[2], '*', 'type', 'status', 'data', ARGV[4])
return {'created', ARGV[1]}
"""

# KEYS: job, events, running set; ARGV: id, now, worker, status data. Queued (or running whose
# worker died, lease since taken over by the caller) becomes running; anything else: 0.
_CLAIM = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' and st ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[2], 'worker', ARGV[3])
if not redis.call('HGET', KEYS[1], 'started_at') then
  redis.call('HSET', KEYS[1], 'started_at', ARGV[2])
end
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('SADD', KEYS[3], ARGV[1])
if st ~= 'running' then redis.call('XADD', KEYS[2], '*', 'type', 'status', 'data', ARGV[4]) end
return 1
"""

# KEYS: job, events, metrics list; ARGV: step, now, metrics json, event data, row json.
# Publishes only past the last published step: a resumed run redoes steps it already reported.
_PUBLISH_STEP = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local last = redis.call('HGET', KEYS[1], 'step')
if last and tonumber(ARGV[1]) <= tonumber(last) then return 0 end
redis.call('HSET', KEYS[1], 'step', ARGV[1], 'metrics', ARGV[3], 'updated_at', ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[5])
redis.call('XADD', KEYS[2], '*', 'type', 'metrics', 'data', ARGV[4])
return 1
"""

# KEYS: job, events; ARGV: step, now, event data. Same once-only rule for checkpoint events.
_PUBLISH_CHECKPOINT = """
local last = redis.call('HGET', KEYS[1], 'checkpoint_step')
if last and tonumber(ARGV[1]) <= tonumber(last) then return 0 end
redis.call('HSET', KEYS[1], 'checkpoint_step', ARGV[1], 'updated_at', ARGV[2])
redis.call('XADD', KEYS[2], '*', 'type', 'checkpoint', 'data', ARGV[3])
return 1
"""

# KEYS: job, events, tenant active, running; ARGV: id, status, now, status data, done data,
# then field/value pairs (error, final model). A finished job never changes again.
_FINISH = """
local st = redis.call('HGET', KEYS[1], 'status')
if (not st) or st == 'succeeded' or st == 'failed' or st == 'cancelled' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'finished_at', ARGV[3], 'updated_at', ARGV[3])
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'type', 'status', 'data', ARGV[4])
redis.call('XADD', KEYS[2], '*', 'type', 'done', 'data', ARGV[5])
return 1
"""

# KEYS: job, events, tenant active, running; ARGV: id, now, status data, done data, log data.
# A queued job is cancelled on the spot (the task skips it when it arrives); a running one gets
# a flag its trainer checks every step.
_CANCEL = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at', ARGV[2], 'updated_at', ARGV[2],
             'cancel_requested', '1')
  redis.call('SREM', KEYS[3], ARGV[1])
  redis.call('SREM', KEYS[4], ARGV[1])
  redis.call('XADD', KEYS[2], '*', 'type', 'status', 'data', ARGV[3])
  redis.call('XADD', KEYS[2], '*', 'type', 'done', 'data', ARGV[4])
  return 'cancelled-while-queued'
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

# KEYS: job, events, lease, running, tenant active; ARGV: id, now, queued data, log data,
# cancelled data, done data, lease token of the caller ('' for none), most worker losses, failed
# data, failed done data, failure message. A running job whose lease expired lost its worker (or
# the holder hands it back): back to queued (the caller re-sends the task), straight to cancelled
# if a cancel was pending, or failed once it has lost more workers than allowed (a job that kills
# its worker, e.g. out of memory, must not take down every worker in turn forever).
_REQUEUE = """
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[7] then return 'leased' end
if holder then redis.call('DEL', KEYS[3]) end
local st = redis.call('HGET', KEYS[1], 'status')
redis.call('SREM', KEYS[4], ARGV[1])
if st ~= 'running' then return 'not-running' end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at', ARGV[2], 'updated_at', ARGV[2])
  redis.call('SREM', KEYS[5], ARGV[1])
  redis.call('XADD', KEYS[2], '*', 'type', 'status', 'data', ARGV[5])
  redis.call('XADD', KEYS[2], '*', 'type', 'done', 'data', ARGV[6])
  return 'cancelled'
end
if ARGV[7] == '' then
  local lost = redis.call('HINCRBY', KEYS[1], 'worker_losses', 1)
  if tonumber(ARGV[8]) > 0 and lost > tonumber(ARGV[8]) then
    redis.call('HSET', KEYS[1], 'status', 'failed', 'finished_at', ARGV[2], 'updated_at', ARGV[2],
               'error_code', 'worker_lost', 'error_message', ARGV[11])
    redis.call('SREM', KEYS[5], ARGV[1])
    redis.call('XADD', KEYS[2], '*', 'type', 'status', 'data', ARGV[9])
    redis.call('XADD', KEYS[2], '*', 'type', 'done', 'data', ARGV[10])
    return 'failed'
  end
end
redis.call('HSET', KEYS[1], 'status', 'queued', 'updated_at', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'requeues', 1)
redis.call('XADD', KEYS[2], '*', 'type', 'log', 'data', ARGV[4])
redis.call('XADD', KEYS[2], '*', 'type', 'status', 'data', ARGV[3])
return 'requeued'
"""


def _status_data(status: str) -> str:
    return json.dumps({"status": status, "at": now_iso()})


def _log_data(message: str) -> str:
    return json.dumps({"message": message, "at": now_iso()})


@dataclass(frozen=True)
class JobRecord:
    """The job hash, decoded; `api.schemas.Job` is its public face."""

    id: str
    tenant: str
    status: str
    queue: str
    name: str | None
    spec_json: str
    spec_digest: str
    created_at: str
    updated_at: str
    started_at: str | None
    finished_at: str | None
    step: int
    total_steps: int
    metrics: dict[str, float] | None
    error_code: str | None
    error_message: str | None
    error_traceback: str | None
    cancel_requested: bool
    attempts: int
    final_model: str | None

    @classmethod
    def from_hash(cls, raw: dict[str, str]) -> JobRecord:
        metrics = raw.get("metrics")
        return cls(
            id=raw["id"],
            tenant=raw["tenant"],
            status=raw["status"],
            queue=raw.get("queue", "cpu"),
            name=raw.get("name") or None,
            spec_json=raw["spec"],
            spec_digest=raw.get("spec_digest", ""),
            created_at=raw["created_at"],
            updated_at=raw.get("updated_at", raw["created_at"]),
            started_at=raw.get("started_at"),
            finished_at=raw.get("finished_at"),
            step=int(raw.get("step", 0)),
            total_steps=int(raw.get("total_steps", 0)),
            metrics=json.loads(metrics) if metrics else None,
            error_code=raw.get("error_code"),
            error_message=raw.get("error_message"),
            error_traceback=raw.get("error_traceback"),
            cancel_requested=raw.get("cancel_requested") == "1",
            attempts=int(raw.get("attempts", 0)),
            final_model=raw.get("final_model"),
        )

    @property
    def spec(self) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(self.spec_json))

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class CreateResult:
    outcome: str  # "created", "existing" (idempotent replay) or "limit"
    job_id: str | None
    active: int = 0
    record: JobRecord | None = None  # the new job, when created


def _record_or_none(raw: dict[str, str]) -> JobRecord | None:
    return JobRecord.from_hash(raw) if raw else None


class AsyncJobStore:
    """What the API does to jobs, over `redis.asyncio` (decode_responses=True)."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
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
    ) -> CreateResult:
        job_id = new_job_id()
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
            "total_steps": str(total_steps),
            "attempts": "0",
        }
        flat = [item for pair in fields.items() for item in pair]
        idem_key = idempotency_key(tenant, idempotency) if idempotency else f"{PREFIX}:idem:-"
        outcome, value = await self._create(
            keys=[
                job_key(job_id),
                events_key(job_id),
                tenant_jobs_key(tenant),
                tenant_active_key(tenant),
                idem_key,
            ],
            args=[
                job_id,
                max_active,
                idempotency_ttl if idempotency else 0,
                _status_data("queued"),
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

    async def list_jobs(
        self, tenant: str, *, limit: int, cursor: str | None, status: str | None
    ) -> tuple[list[JobRecord], str | None]:
        """Newest first from the tenant's index, filtered; the cursor is the last id returned."""
        if status in ("queued", "running"):
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
        """Queued or running jobs come from the small active set (bounded by the quota), not
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
        """'cancelled-while-queued', 'requested' (running), 'already-<status>' or 'missing'."""
        record = await self.get(job_id)
        if record is None:
            return "missing"
        outcome = await self._cancel(
            keys=[
                job_key(job_id),
                events_key(job_id),
                tenant_active_key(record.tenant),
                RUNNING_SET,
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
        keys = [job_key(job.id), events_key(job.id), tenant_active_key(job.tenant), RUNNING_SET]
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
        rows = cast(list[str], await self.redis.lrange(metrics_key(job_id), 0, -1))
        return [json.loads(row) for row in rows]

    async def events_after(
        self, job_id: str, after: str, count: int = 1000
    ) -> list[tuple[str, dict[str, str]]]:
        """Stream entries strictly after `after` ("0" for all), oldest first."""
        start = f"({after}" if after not in ("0", "0-0") else "-"
        entries = await self.redis.xrange(events_key(job_id), start, "+", count=count)
        return cast(list[tuple[str, dict[str, str]]], entries)

    async def last_event_id(self, job_id: str) -> str:
        entries = await self.redis.xrevrange(events_key(job_id), "+", "-", count=1)
        return cast(str, entries[0][0]) if entries else "0-0"


class JobStore:
    """What the workers do to jobs, over the synchronous client (decode_responses=True)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._claim = client.register_script(_CLAIM)
        self._publish_step = client.register_script(_PUBLISH_STEP)
        self._publish_checkpoint = client.register_script(_PUBLISH_CHECKPOINT)
        self._finish = client.register_script(_FINISH)
        self._requeue = client.register_script(_REQUEUE)

    def get(self, job_id: str) -> JobRecord | None:
        return _record_or_none(cast(dict[str, str], self.redis.hgetall(job_key(job_id))))

    def claim(self, job_id: str, worker: str) -> bool:
        keys = [job_key(job_id), events_key(job_id), RUNNING_SET]
        args = [job_id, now_iso(), worker, _status_data("running")]
        return bool(self._claim(keys=keys, args=args))

    def cancel_requested(self, job_id: str) -> bool:
        return self.redis.hget(job_key(job_id), "cancel_requested") == "1"

    def publish_step(self, job_id: str, step: int, total: int, metrics: dict[str, float]) -> bool:
        metrics_json = json.dumps(metrics)
        event = json.dumps({"step": step, "total": total, "metrics": metrics})
        row = json.dumps({"step": step, "metrics": metrics})
        keys = [job_key(job_id), events_key(job_id), metrics_key(job_id)]
        return bool(self._publish_step(keys=keys, args=[step, now_iso(), metrics_json, event, row]))

    def publish_checkpoint(self, job_id: str, step: int, name: str) -> bool:
        data = json.dumps({"step": step, "name": name})
        keys = [job_key(job_id), events_key(job_id)]
        return bool(self._publish_checkpoint(keys=keys, args=[step, now_iso(), data]))

    def publish_log(self, job_id: str, message: str) -> None:
        self.redis.xadd(events_key(job_id), {"type": "log", "data": _log_data(message)})

    def finish(self, job: JobRecord, status: str, extra: dict[str, str] | None = None) -> bool:
        pairs = [item for pair in (extra or {}).items() for item in pair]
        keys = [job_key(job.id), events_key(job.id), tenant_active_key(job.tenant), RUNNING_SET]
        args = [job.id, status, now_iso(), _status_data(status), json.dumps({"status": status})]
        return bool(self._finish(keys=keys, args=[*args, *pairs]))

    def running_job_ids(self) -> list[str]:
        return sorted(cast(set[str], self.redis.smembers(RUNNING_SET)))

    def requeue_if_orphaned(
        self,
        job: JobRecord,
        reason: str = "worker lost; queued again to resume from its last checkpoint",
        lease_token: str = "",
        max_worker_losses: int = 0,
    ) -> str:
        """'requeued' (the caller must send the task again), 'cancelled' (a cancel was pending),
        'failed' (more than `max_worker_losses` workers died on it; 0: no limit), 'leased' (its
        worker is alive) or 'not-running'. The lease holder passes its token to hand the job
        back without a window where a reaper could take it first (that is no worker loss)."""
        keys = [
            job_key(job.id),
            events_key(job.id),
            lease_key(job.id),
            RUNNING_SET,
            tenant_active_key(job.tenant),
        ]
        args: list[str | int] = [
            job.id,
            now_iso(),
            _status_data("queued"),
            _log_data(reason),
            _status_data("cancelled"),
            json.dumps({"status": "cancelled"}),
            lease_token,
            max_worker_losses,
            _status_data("failed"),
            json.dumps({"status": "failed"}),
            f"the job's worker died {max_worker_losses + 1} times while running it "
            "(killed, out of memory, or lost its machine); not retried again",
        ]
        return str(self._requeue(keys=keys, args=args))
