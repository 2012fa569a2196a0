"""Every change of a job's state, in one place: each a Lua script and the typed call that runs it.

A change that must not race with the API or another worker (create, claim, publish, finish,
requeue, cancel, pause, resume, patch, delete) is one script, so the record, the indexes, the
outbox and the event stream never disagree, whoever crashes when
(docs/developers/design.md#the-outbox). Each script is run through a frozen dataclass of its own
whose named fields build KEYS and ARGV (`keys()`, `args()`): the order a script reads them in
lives there, once, right under the script. The front ends (`api_side`, `worker_side`,
`steering`, `pdppo.store.deletion`) choose the values; `tests/store/transitions.py` is the whole
machine as one table of states x requests.

Fencing (docs/developers/design.md#fencing). Every write a job process makes passes the lease
token of its claim; a fenced script compares it with the lease key in the same script as the
write and refuses a stale one with `STALE`, which the calls raise as `FencedOut`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import redis
import redis.asyncio as aredis

from pdppo.store.jobs.clock import STORE_TICK
from pdppo.store.jobs.fair import FAIR
from pdppo.store.jobs.records import JobRecord, record_or_none
from pdppo.store.keys import (
    OUTBOX,
    PURGE_SET,
    RUNNING_SET,
    STALL_SEEN,
    STORE_CLOCK,
    WEBHOOK_FEED,
    eval_key,
    events_key,
    job_key,
    lease_key,
    metrics_key,
    samples_key,
    tenant_active_key,
    tenant_jobs_key,
)
from pdppo.store.retry import ADD_ONCE
from pdppo.store.stats import COUNT_END, STATS
from pdppo.store.webhooks.feed import FEED_EVENT

Arg = str | int | float
"""One ARGV value, as redis-py sends it."""

STALE = -1
"""What a fenced script returns for a write whose lease token no longer holds the job's lease."""


class FencedOut(RuntimeError):
    """A write refused: the writer's lease token no longer holds the job's lease (it expired,
    or another worker took the job). Not transient: the writer must stop, without a checkpoint."""

    def __init__(self, job_id: str, what: str) -> None:
        super().__init__(
            f"{what} of job {job_id} refused: this claim no longer holds the job's lease"
        )
        self.job_id = job_id


def fenced(script: str, lease: int, token: int) -> str:
    """`script`, run only while KEYS[lease] holds ARGV[token] (an empty token: no fence, for a
    caller that holds no lease, such as a test seeding a record); else it returns STALE."""
    fence = (
        f"if ARGV[{token}] ~= '' and redis.call('GET', KEYS[{lease}]) ~= ARGV[{token}] then "
        f"return {STALE} end\n"
    )
    return fence + script


def checked(job_id: str, what: str, result: object) -> bool:
    """A fenced script's answer as a bool, `FencedOut` for STALE."""
    if result == STALE:
        raise FencedOut(job_id, what)
    return bool(result)


def pairs(fields: Mapping[str, str]) -> list[Arg]:
    """A hash's fields as the flat field/value list a script's variadic ARGV tail takes."""
    return [item for pair in fields.items() for item in pair]


# --- create (API) -------------------------------------------------------------------------------

# Under the tenant's quota, or the job an Idempotency-Key made already. The outbox entry is
# written with the record, so no crash can leave a job that nobody will ever enqueue.
CREATE = """
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
CREATE = FAIR + FEED_EVENT + CREATE


@dataclass(frozen=True, kw_only=True)
class Create:
    """A new job with the hash `fields`: ('created', id), ('existing', id) or ('limit', active)."""

    job_id: str
    tenant: str
    idempotency_key: str  # the key's Redis name; any name when `idempotency_ttl` is 0
    max_active: int  # the tenant's quota of active jobs
    idempotency_ttl: int  # 0: no key is kept or looked up
    status_data: str
    check_at: float  # when a dispatcher first looks for its task (`pdppo.store.jobs.outbox`)
    fields: Mapping[str, str]

    def keys(self) -> list[str]:
        return [
            job_key(self.job_id),
            events_key(self.job_id),
            tenant_jobs_key(self.tenant),
            tenant_active_key(self.tenant),
            self.idempotency_key,
            OUTBOX,
            WEBHOOK_FEED,
        ]

    def args(self) -> list[Arg]:
        return [
            self.job_id,
            self.max_active,
            self.idempotency_ttl,
            self.status_data,
            self.check_at,
            *pairs(self.fields),
        ]

    async def arun(self, client: aredis.Redis) -> tuple[str, str]:
        create = client.register_script(CREATE)
        outcome, value = await create(keys=self.keys(), args=self.args())
        return str(outcome), str(value)


# --- claim (worker) -----------------------------------------------------------------------------

# Queued (or running whose worker died, lease since taken over by the caller) becomes running and
# leaves the outbox (its task has reached a worker); anything else: 0. The phase starts at `loading
# model`: a job process spends its first seconds starting and importing torch before its trainer
# says so, and the last run's phase is not this one's.
CLAIM = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' and st ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[2], 'worker', ARGV[3])
redis.call('HSET', KEYS[1], 'phase', ARGV[5])
redis.call('HDEL', KEYS[1], 'pause_stopping')
if not redis.call('HGET', KEYS[1], 'started_at') then
  redis.call('HSET', KEYS[1], 'started_at', ARGV[2])
end
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
fair_started(KEYS[1])
if st ~= 'running' then job_event(KEYS[2], KEYS[5], KEYS[1], 'status', ARGV[4]) end
return 1
"""
CLAIM = FAIR + FEED_EVENT + CLAIM


@dataclass(frozen=True, kw_only=True)
class Claim:
    job_id: str
    now: str
    worker: str
    status_data: str
    phase: str  # the phase's JSON

    def keys(self) -> list[str]:
        return [job_key(self.job_id), events_key(self.job_id), RUNNING_SET, OUTBOX, WEBHOOK_FEED]

    def args(self) -> list[Arg]:
        return [self.job_id, self.now, self.worker, self.status_data, self.phase]

    def run(self, client: redis.Redis) -> bool:
        claim = client.register_script(CLAIM)
        return bool(claim(keys=self.keys(), args=self.args()))


# --- publish (job process, fenced) --------------------------------------------------------------

# A step's metrics, only past the last published step: a resumed run redoes steps it already
# reported.
PUBLISH_STEP = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local last = redis.call('HGET', KEYS[1], 'step')
if last and tonumber(ARGV[1]) <= tonumber(last) then return 0 end
redis.call('HSET', KEYS[1], 'step', ARGV[1], 'metrics', ARGV[3], 'updated_at', ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[5])
redis.call('XADD', KEYS[2], '*', 'type', 'metrics', 'data', ARGV[4])
return 1
"""
PUBLISH_STEP = fenced(PUBLISH_STEP, lease=4, token=6)


@dataclass(frozen=True, kw_only=True)
class PublishStep:
    job_id: str
    step: int
    now: str
    metrics: str  # the record's `metrics` (JSON)
    event: str  # the `metrics` event's data
    row: str  # the row of `/metrics`
    lease_token: str

    def keys(self) -> list[str]:
        job_id = self.job_id
        return [job_key(job_id), events_key(job_id), metrics_key(job_id), lease_key(job_id)]

    def args(self) -> list[Arg]:
        return [self.step, self.now, self.metrics, self.event, self.row, self.lease_token]

    def run(self, client: redis.Redis) -> bool:
        publish_step = client.register_script(PUBLISH_STEP)
        result = publish_step(keys=self.keys(), args=self.args())
        return checked(self.job_id, f"step {self.step}", result)


# A step's `eval` or `samples`: the same once-only rule as metrics, by a step field of its own;
# the list keeps its newest rows.
PUBLISH_RESULT = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local last = redis.call('HGET', KEYS[1], ARGV[5])
if last and tonumber(ARGV[1]) <= tonumber(last) then return 0 end
redis.call('HSET', KEYS[1], ARGV[5], ARGV[1], 'updated_at', ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[4])
local keep = tonumber(ARGV[7])
if keep > 0 then redis.call('LTRIM', KEYS[3], -keep, -1) end
redis.call('XADD', KEYS[2], '*', 'type', ARGV[6], 'data', ARGV[3])
return 1
"""
PUBLISH_RESULT = fenced(PUBLISH_RESULT, lease=4, token=8)


@dataclass(frozen=True, kw_only=True)
class PublishResult:
    job_id: str
    rows_key: str  # the list of rows (`eval_key`, `samples_key`)
    step: int
    now: str
    event: str
    row: str
    step_field: str  # the hash field holding the last published step of this kind
    event_type: str
    keep: int  # rows kept, newest first (0: all)
    lease_token: str
    what: str  # how a refusal names it

    def keys(self) -> list[str]:
        return [
            job_key(self.job_id),
            events_key(self.job_id),
            self.rows_key,
            lease_key(self.job_id),
        ]

    def args(self) -> list[Arg]:
        return [
            self.step,
            self.now,
            self.event,
            self.row,
            self.step_field,
            self.event_type,
            self.keep,
            self.lease_token,
        ]

    def run(self, client: redis.Redis) -> bool:
        publish_result = client.register_script(PUBLISH_RESULT)
        result = publish_result(keys=self.keys(), args=self.args())
        return checked(self.job_id, f"{self.what} {self.step}", result)


# The same once-only rule for checkpoint events, and the same refusal once the job is no longer
# running (its worker may still hold the lease a moment after ending it: no checkpoint after its
# `done`).
PUBLISH_CHECKPOINT = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local last = redis.call('HGET', KEYS[1], 'checkpoint_step')
if last and tonumber(ARGV[1]) <= tonumber(last) then return 0 end
redis.call('HSET', KEYS[1], 'checkpoint_step', ARGV[1], 'updated_at', ARGV[2])
job_event(KEYS[2], KEYS[4], KEYS[1], 'checkpoint', ARGV[3])
return 1
"""
PUBLISH_CHECKPOINT = FEED_EVENT + fenced(PUBLISH_CHECKPOINT, lease=3, token=4)


@dataclass(frozen=True, kw_only=True)
class PublishCheckpoint:
    job_id: str
    step: int
    now: str
    event: str
    lease_token: str

    def keys(self) -> list[str]:
        return [job_key(self.job_id), events_key(self.job_id), lease_key(self.job_id), WEBHOOK_FEED]

    def args(self) -> list[Arg]:
        return [self.step, self.now, self.event, self.lease_token]

    def run(self, client: redis.Redis) -> bool:
        publish_checkpoint = client.register_script(PUBLISH_CHECKPOINT)
        result = publish_checkpoint(keys=self.keys(), args=self.args())
        return checked(self.job_id, f"checkpoint {self.step}", result)


# What a running job is doing (`core.training.callbacks.PHASES`): the record's `phase` and a
# `phase` event. Not once-only: a phase may come again (training after each evaluation), and a
# retried one repeats harmlessly.
PUBLISH_PHASE = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'phase', ARGV[1], 'updated_at', ARGV[3])
redis.call('XADD', KEYS[2], '*', 'type', 'phase', 'data', ARGV[2])
return 1
"""
PUBLISH_PHASE = fenced(PUBLISH_PHASE, lease=3, token=4)


@dataclass(frozen=True, kw_only=True)
class PublishPhase:
    job_id: str
    name: str  # how a refusal names it
    phase: str  # the record's `phase` (JSON)
    event: str
    at: str  # when the trainer said it
    lease_token: str

    def keys(self) -> list[str]:
        return [job_key(self.job_id), events_key(self.job_id), lease_key(self.job_id)]

    def args(self) -> list[Arg]:
        return [self.phase, self.event, self.at, self.lease_token]

    def run(self, client: redis.Redis) -> bool:
        publish_phase = client.register_script(PUBLISH_PHASE)
        result = publish_phase(keys=self.keys(), args=self.args())
        return checked(self.job_id, f"phase {self.name}", result)


# The experiment-tracker runs a running job reports to (`core.tracking`), merged into its
# record's `trackers`.
PUBLISH_TRACKERS = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local known = redis.call('HGET', KEYS[1], 'trackers')
local runs = known and cjson.decode(known) or {}
for name, run in pairs(cjson.decode(ARGV[1])) do runs[name] = run end
redis.call('HSET', KEYS[1], 'trackers', cjson.encode(runs))
return 1
"""
PUBLISH_TRACKERS = fenced(PUBLISH_TRACKERS, lease=2, token=2)


@dataclass(frozen=True, kw_only=True)
class PublishTrackers:
    job_id: str
    runs: str  # {tracker: {run_id, url}} (JSON)
    lease_token: str

    def keys(self) -> list[str]:
        return [job_key(self.job_id), lease_key(self.job_id)]

    def args(self) -> list[Arg]:
        return [self.runs, self.lease_token]

    def run(self, client: redis.Redis) -> bool:
        publish_trackers = client.register_script(PUBLISH_TRACKERS)
        result = publish_trackers(keys=self.keys(), args=self.args())
        return checked(self.job_id, "tracker runs", result)


# A job process's log line, exactly once through a stall (`pdppo.store.retry.add_event_once`),
# and only while fenced.
ADD_LOG_ONCE = fenced(ADD_ONCE, lease=2, token=4)


@dataclass(frozen=True, kw_only=True)
class AddLogOnce:
    job_id: str
    type: str
    data: str
    window: int  # the stream's latest entries looked through (`LOG_RECOVERY_WINDOW`)
    lease_token: str

    def keys(self) -> list[str]:
        return [events_key(self.job_id), lease_key(self.job_id)]

    def args(self) -> list[Arg]:
        return [self.type, self.data, self.window, self.lease_token]

    def run(self, client: redis.Redis) -> bool:
        add_log_once = client.register_script(ADD_LOG_ONCE)
        result = add_log_once(keys=self.keys(), args=self.args())
        return checked(self.job_id, "a log line", result)


# --- pause carried out (worker, fenced) ---------------------------------------------------------

# The worker carries out a pending pause (not while a cancel is pending: the cancel wins): from
# now on the job is stopping for it, and a resume that withdraws the pause says so (`RESUME`)
# rather than that the job runs on.
BEGIN_PAUSE = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
if redis.call('HGET', KEYS[1], 'pause_requested') ~= '1' then return 0 end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return 0 end
redis.call('HSET', KEYS[1], 'pause_stopping', '1')
return 1
"""
BEGIN_PAUSE = fenced(BEGIN_PAUSE, lease=2, token=1)


@dataclass(frozen=True, kw_only=True)
class BeginPause:
    job_id: str
    lease_token: str

    def keys(self) -> list[str]:
        return [job_key(self.job_id), lease_key(self.job_id)]

    def args(self) -> list[Arg]:
        return [self.lease_token]

    def run(self, client: redis.Redis) -> bool:
        begin_pause = client.register_script(BEGIN_PAUSE)
        return checked(self.job_id, "the pause", begin_pause(keys=self.keys(), args=self.args()))


# --- finish (worker; the API's fail) ------------------------------------------------------------

# The job ends with `status` and the field/value pairs of `fields` (error, final model). A
# finished job never changes again.
FINISH = """
local st = redis.call('HGET', KEYS[1], 'status')
if (not st) or st == 'succeeded' or st == 'failed' or st == 'cancelled' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'finished_at', ARGV[3], 'updated_at', ARGV[3])
redis.call('HDEL', KEYS[1], 'pause_stopping')
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
fair_dropped(KEYS[1])
job_event(KEYS[2], KEYS[7], KEYS[1], 'status', ARGV[4])
redis.call('XADD', KEYS[2], '*', 'type', 'done', 'data', ARGV[5])
count_end(KEYS[6], KEYS[1], ARGV[2])
return 1
"""
FINISH = FAIR + COUNT_END + FEED_EVENT + FINISH


@dataclass(frozen=True, kw_only=True)
class Finish:
    job_id: str
    tenant: str
    status: str
    now: str
    status_data: str
    done_data: str
    fields: Mapping[str, str]

    def keys(self) -> list[str]:
        return [
            job_key(self.job_id),
            events_key(self.job_id),
            tenant_active_key(self.tenant),
            RUNNING_SET,
            OUTBOX,
            STATS,
            WEBHOOK_FEED,
        ]

    def args(self) -> list[Arg]:
        head: list[Arg] = [self.job_id, self.status, self.now, self.status_data, self.done_data]
        return [*head, *pairs(self.fields)]

    def run(self, client: redis.Redis) -> bool:
        finish = client.register_script(FINISH)
        return bool(finish(keys=self.keys(), args=self.args()))

    async def arun(self, client: aredis.Redis) -> bool:
        finish = client.register_script(FINISH)
        return bool(await finish(keys=self.keys(), args=self.args()))


# --- requeue (reaper, or the lease holder handing the job back) ---------------------------------

# A reaper (no token) finding a running job while a stall is held (`pdppo.store.jobs.clock`)
# answers 'held' and changes nothing: its holder may be alive, and hands it back with the true
# reason. A running job whose lease expired lost its worker (or the holder hands it back): back to
# queued and into the outbox (the caller re-sends the task; a dispatcher does if the caller dies
# first), straight to cancelled if a cancel was pending, paused if a pause was, or failed once it
# has lost more workers than allowed (a job that kills its worker, e.g. out of memory, must not
# take down every worker in turn forever).
REQUEUE = """
local stalled = false
if ARGV[15] ~= '' then stalled = store_tick(KEYS[9], KEYS[10], ARGV[15], ARGV[16]) end
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[7] then return 'leased' end
if stalled and ARGV[7] == '' and redis.call('HGET', KEYS[1], 'status') == 'running' then
  return 'held'
end
if holder then redis.call('DEL', KEYS[3]) end
local st = redis.call('HGET', KEYS[1], 'status')
redis.call('SREM', KEYS[4], ARGV[1])
if st ~= 'running' then return 'not-running' end
redis.call('HDEL', KEYS[1], 'pause_stopping')
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at', ARGV[2], 'updated_at', ARGV[2])
  redis.call('SREM', KEYS[5], ARGV[1])
  redis.call('ZREM', KEYS[6], ARGV[1])
  job_event(KEYS[2], KEYS[8], KEYS[1], 'status', ARGV[5])
  redis.call('XADD', KEYS[2], '*', 'type', 'done', 'data', ARGV[6])
  count_end(KEYS[7], KEYS[1], 'cancelled')
  return 'cancelled'
end
if redis.call('HGET', KEYS[1], 'pause_requested') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'paused', 'updated_at', ARGV[2])
  redis.call('HDEL', KEYS[1], 'pause_requested')
  redis.call('XADD', KEYS[2], '*', 'type', 'log', 'data', ARGV[14])
  job_event(KEYS[2], KEYS[8], KEYS[1], 'status', ARGV[13])
  return 'paused'
end
if ARGV[7] == '' then
  local lost = redis.call('HINCRBY', KEYS[1], 'worker_losses', 1)
  if tonumber(ARGV[8]) > 0 and lost > tonumber(ARGV[8]) then
    redis.call('HSET', KEYS[1], 'status', 'failed', 'finished_at', ARGV[2], 'updated_at', ARGV[2],
               'error_code', 'worker_lost', 'error_message', ARGV[11])
    redis.call('SREM', KEYS[5], ARGV[1])
    redis.call('ZREM', KEYS[6], ARGV[1])
    job_event(KEYS[2], KEYS[8], KEYS[1], 'status', ARGV[9])
    redis.call('XADD', KEYS[2], '*', 'type', 'done', 'data', ARGV[10])
    count_end(KEYS[7], KEYS[1], 'failed')
    return 'failed'
  end
end
redis.call('HSET', KEYS[1], 'status', 'queued', 'updated_at', ARGV[2], 'queued_at', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'requeues', 1)
redis.call('ZADD', KEYS[6], ARGV[12], ARGV[1])
fair_enqueue(KEYS[1])
redis.call('XADD', KEYS[2], '*', 'type', 'log', 'data', ARGV[4])
job_event(KEYS[2], KEYS[8], KEYS[1], 'status', ARGV[3])
return 'requeued'
"""
REQUEUE = FAIR + COUNT_END + FEED_EVENT + STORE_TICK + REQUEUE


@dataclass(frozen=True, kw_only=True)
class Requeue:
    job_id: str
    tenant: str
    now: str
    queued_data: str
    log_data: str  # why it is queued again
    cancelled_data: str
    cancelled_done_data: str
    lease_token: str  # the caller's ('' for a reaper, which holds none)
    max_worker_losses: int  # 0: no limit
    failed_data: str
    failed_done_data: str
    failure_message: str
    check_at: float  # when a dispatcher first looks for its task
    paused_data: str
    paused_log_data: str
    stall_gap_ms: int | str  # '' (with `stall_hold_ms`): no clock stamp
    stall_hold_ms: int | str

    def keys(self) -> list[str]:
        return [
            job_key(self.job_id),
            events_key(self.job_id),
            lease_key(self.job_id),
            RUNNING_SET,
            tenant_active_key(self.tenant),
            OUTBOX,
            STATS,
            WEBHOOK_FEED,
            STORE_CLOCK,
            STALL_SEEN,
        ]

    def args(self) -> list[Arg]:
        return [
            self.job_id,
            self.now,
            self.queued_data,
            self.log_data,
            self.cancelled_data,
            self.cancelled_done_data,
            self.lease_token,
            self.max_worker_losses,
            self.failed_data,
            self.failed_done_data,
            self.failure_message,
            self.check_at,
            self.paused_data,
            self.paused_log_data,
            self.stall_gap_ms,
            self.stall_hold_ms,
        ]

    def run(self, client: redis.Redis) -> str:
        requeue = client.register_script(REQUEUE)
        return str(requeue(keys=self.keys(), args=self.args()))


# --- cancel (API) -------------------------------------------------------------------------------

# A queued or paused job is cancelled on the spot and leaves the outbox (a task already sent skips
# it when it arrives); a running one gets a flag its trainer checks every step.
CANCEL = """
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
CANCEL = FAIR + COUNT_END + FEED_EVENT + CANCEL


@dataclass(frozen=True, kw_only=True)
class Cancel:
    job_id: str
    tenant: str
    now: str
    status_data: str
    done_data: str
    log_data: str  # a running job's: the cancel is requested

    def keys(self) -> list[str]:
        return [
            job_key(self.job_id),
            events_key(self.job_id),
            tenant_active_key(self.tenant),
            RUNNING_SET,
            OUTBOX,
            STATS,
            WEBHOOK_FEED,
        ]

    def args(self) -> list[Arg]:
        return [self.job_id, self.now, self.status_data, self.done_data, self.log_data]

    async def arun(self, client: aredis.Redis) -> str:
        cancel = client.register_script(CANCEL)
        return str(await cancel(keys=self.keys(), args=self.args()))


# --- pause (API) --------------------------------------------------------------------------------

# Returns {outcome, the job's hash as the script left it}: the API answers with that hash, not one
# read after, which a worker carrying the pause out (or a resume) may have changed meanwhile.
PAUSE = """
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
PAUSE = FAIR + FEED_EVENT + PAUSE


@dataclass(frozen=True, kw_only=True)
class Pause:
    job_id: str
    now: str
    paused_data: str
    log_data: str  # a running job's: the pause is requested

    def keys(self) -> list[str]:
        return [job_key(self.job_id), events_key(self.job_id), OUTBOX, WEBHOOK_FEED]

    def args(self) -> list[Arg]:
        return [self.now, self.paused_data, self.log_data]

    async def arun(self, client: aredis.Redis) -> tuple[str, JobRecord | None]:
        pause = client.register_script(PAUSE)
        said, fields = await pause(keys=self.keys(), args=self.args())
        raw = dict(zip(fields[::2], fields[1::2], strict=True))
        return str(said), record_or_none(raw)


# --- resume (API) -------------------------------------------------------------------------------

# A paused job goes back to the queue and the outbox. One failed for its disk (`storage_full`,
# `storage_error`) is queued again too, taking a place in the tenant's active jobs ('limit' when
# they are full). A pause not yet carried out is withdrawn; one its worker had begun stopping for
# (`BEGIN_PAUSE`) says so: that job stops anyway, and is queued again.
RESUME = """
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
RESUME = FAIR + FEED_EVENT + RESUME


@dataclass(frozen=True, kw_only=True)
class Resume:
    job_id: str
    tenant: str
    now: str
    queued_data: str
    check_at: float  # when a dispatcher first looks for its task
    withdrawn_log_data: str  # a pause withdrawn before its worker began carrying it out
    max_active: int  # the tenant's quota, for a job failed for its disk
    storage_log_data: str  # a job failed for its disk, resumed
    stopping_log_data: str  # a pause withdrawn once its worker had begun stopping the job

    def keys(self) -> list[str]:
        return [
            job_key(self.job_id),
            events_key(self.job_id),
            OUTBOX,
            tenant_active_key(self.tenant),
            WEBHOOK_FEED,
        ]

    def args(self) -> list[Arg]:
        return [
            self.now,
            self.queued_data,
            self.check_at,
            self.withdrawn_log_data,
            self.max_active,
            self.storage_log_data,
            self.stopping_log_data,
        ]

    async def arun(self, client: aredis.Redis) -> str:
        resume = client.register_script(RESUME)
        return str(await resume(keys=self.keys(), args=self.args()))


# --- patch: change a job's settings (API) -------------------------------------------------------

# Compare-and-set on the version: two concurrent changes never lose one another (the loser
# computes again from the winner's overrides). The If-Match precondition is checked here, with
# the write, so that a retried change whose first attempt landed meanwhile is refused, not made
# over the first (`precondition`, the route's 412).
PATCH = """
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


@dataclass(frozen=True, kw_only=True)
class Patch:
    job_id: str
    base_version: int  # the version the change was computed from
    overrides: str  # the cumulative change (JSON)
    now: str
    total_steps: int | str  # '': unchanged
    log_data: str
    expected_versions: str  # the versions an If-Match names, space-separated ('': no If-Match)

    def keys(self) -> list[str]:
        return [job_key(self.job_id), events_key(self.job_id)]

    def args(self) -> list[Arg]:
        return [
            self.base_version,
            self.overrides,
            self.now,
            self.total_steps,
            self.log_data,
            self.expected_versions,
        ]

    async def arun(self, client: aredis.Redis) -> tuple[str, str]:
        patch = client.register_script(PATCH)
        outcome, value = await patch(keys=self.keys(), args=self.args())
        return str(outcome), str(value)


# A job process's `config` event, once per version, only while it holds the lease.
ANNOUNCE = """
local last = tonumber(redis.call('HGET', KEYS[1], 'config_applied') or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('HSET', KEYS[1], 'config_applied', ARGV[1])
redis.call('XADD', KEYS[2], '*', 'type', 'config', 'data', ARGV[2])
return 1
"""
ANNOUNCE = fenced(ANNOUNCE, lease=3, token=3)


@dataclass(frozen=True, kw_only=True)
class Announce:
    job_id: str
    version: int
    event: str
    lease_token: str

    def keys(self) -> list[str]:
        return [job_key(self.job_id), events_key(self.job_id), lease_key(self.job_id)]

    def args(self) -> list[Arg]:
        return [self.version, self.event, self.lease_token]

    def run(self, client: redis.Redis) -> bool:
        announce = client.register_script(ANNOUNCE)
        result = announce(keys=self.keys(), args=self.args())
        return checked(self.job_id, f"config {self.version}", result)


# --- delete (API) -------------------------------------------------------------------------------

JOB_KEY_PREFIX = job_key("")
"""What a job's hash key is, less its id: `USERS` reads the active jobs' specs by it."""

# users(active set, job key prefix, file id or '', model name or ''): the sorted ids of the
# active jobs whose spec names the file (as its dataset or held-out file) or starts from the model.
# Those job hashes are not declared in KEYS, which a single Redis (what the service runs on)
# allows and Redis Cluster would not. `pdppo.store.deletion` deletes files and expires artifacts
# by the same rule.
USERS = """
local function users(active, prefix, file, model)
  local found = {}
  for _, id in ipairs(redis.call('SMEMBERS', active)) do
    local spec = redis.call('HGET', prefix .. id, 'spec')
    local ok, doc = false, nil
    if spec then ok, doc = pcall(cjson.decode, spec) end
    if ok and type(doc) == 'table' and type(doc.train) == 'table' then
      local task, m = doc.train.task, doc.train.model
      local hit = false
      if file ~= '' and type(task) == 'table' then
        hit = task.file == file or task.validation_file == file
      end
      if model ~= '' and type(m) == 'table' and m.name == model then hit = true end
      if hit then found[#found + 1] = id end
    end
  end
  table.sort(found)
  return found
end
local function ended(st)
  return st == 'succeeded' or st == 'failed' or st == 'cancelled'
end
"""

# An ended job of the tenant, once no worker holds its lease (a worker finishes a job, then gives
# up its lease: in between it may still write the job's last events) and no active job of the
# tenant starts from its final model (`job:<id>`). Its record, events, metrics, evaluations and
# samples go; its id enters the purge set, which the caller empties once its folder is gone.
DELETE_JOB = (
    USERS
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if (not st) or redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[2] then return {'missing'} end
if not ended(st) then return {'active', st} end
if redis.call('EXISTS', KEYS[6]) == 1 then return {'leased'} end
local used = users(KEYS[8], ARGV[4], '', 'job:' .. ARGV[1])
if #used > 0 then table.insert(used, 1, 'used'); return used end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('SREM', KEYS[8], ARGV[1])
redis.call('SREM', KEYS[9], ARGV[1])
redis.call('ZREM', KEYS[10], ARGV[1])
redis.call('ZADD', KEYS[11], ARGV[3], ARGV[1])
return {'deleted'}
"""
)


@dataclass(frozen=True, kw_only=True)
class DeleteJob:
    """{'deleted'}, {'missing'}, {'active', status}, {'leased'} or {'used', ids...}."""

    job_id: str
    tenant: str
    now: float  # epoch seconds: the purge set's score

    def keys(self) -> list[str]:
        job_id = self.job_id
        return [
            job_key(job_id),
            events_key(job_id),
            metrics_key(job_id),
            eval_key(job_id),
            samples_key(job_id),
            lease_key(job_id),
            tenant_jobs_key(self.tenant),
            tenant_active_key(self.tenant),
            RUNNING_SET,
            OUTBOX,
            PURGE_SET,
        ]

    def args(self) -> list[Arg]:
        return [self.job_id, self.tenant, self.now, JOB_KEY_PREFIX]

    async def arun(self, client: aredis.Redis) -> list[str]:
        delete_job = client.register_script(DELETE_JOB)
        return cast(list[str], await delete_job(keys=self.keys(), args=self.args()))
