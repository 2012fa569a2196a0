"""The job operations a worker runs while it holds a job: claim, publish, finish, requeue.

Each state change that must not race with the API or another worker (claim, publish a step, its
evaluation, its samples or a checkpoint, finish, requeue an orphan) is one Lua script, defined
next to the method that runs it, so the record, the indexes and the event stream never disagree,
whoever crashes when. The API's `AsyncJobStore.fail` runs the same `_FINISH` script. The scripts
keep the enqueue outbox (`pdppo.store.jobs.outbox`) in step: a claimed or finished job leaves it, a
requeued one enters it in the same script that flips it to `queued`, so a requeuer that dies
before it re-sends the task strands nothing.

Fencing (docs/developers/design.md#fencing, issue 12). A job process runs apart from the worker that
holds its lease, so a worker frozen past its lease (SIGSTOP, a VM pause, a swap stall) leaves a job
process that goes on training while a second worker resumes the job. Each claim's token is the lease
token of the worker that claimed (`workers.job.lease`: random per claim, and the lease key names the
holder), and every write a job process makes passes it: each publishing script first compares it
with the lease key, in the same script as the write, and refuses a stale token with `STALE` (which
the methods raise as `FencedOut`). So a stale process's writes are refused from the moment its lease
expires, before anybody else even claims the job, at no extra round trip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis

from pdppo.store.jobs.clock import STORE_TICK, gap_and_hold_ms
from pdppo.store.jobs.events import EventStore, _log_data, _status_data
from pdppo.store.jobs.fair import FAIR, FairQueue
from pdppo.store.jobs.outbox import DEFAULT_GRACE_SECONDS, Outbox
from pdppo.store.jobs.records import JobRecord, _record_or_none
from pdppo.store.keys import (
    OUTBOX,
    RUNNING_SET,
    STALL_SEEN,
    STORE_CLOCK,
    WEBHOOK_FEED,
    eval_key,
    events_key,
    job_key,
    lease_key,
    metrics_key,
    now_iso,
    samples_key,
    tenant_active_key,
)
from pdppo.store.retry import _ADD_ONCE, LOG_RECOVERY_WINDOW
from pdppo.store.stats import COUNT_END, STATS
from pdppo.store.webhooks.feed import FEED_EVENT

STARTING_PHASE = json.dumps({"name": "loading model", "done": None, "total": None})
"""A claimed job's phase until its trainer tells its own (`core.training.callbacks.PHASES`)."""

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


def _fenced(script: str, lease: int, token: int) -> str:
    """`script`, run only while KEYS[lease] holds ARGV[token] (an empty token: no fence, for a
    caller that holds no lease, such as a test seeding a record); else it returns STALE."""
    fence = (
        f"if ARGV[{token}] ~= '' and redis.call('GET', KEYS[{lease}]) ~= ARGV[{token}] then "
        f"return {STALE} end\n"
    )
    return fence + script


def _checked(job_id: str, what: str, result: object) -> bool:
    if result == STALE:
        raise FencedOut(job_id, what)
    return bool(result)


# KEYS: job, events, running set, outbox, webhook feed; ARGV: id, now, worker, status data, phase.
# Queued (or running whose worker died, lease since taken over by the caller) becomes running and
# leaves the outbox (its task has reached a worker); anything else: 0. The phase starts at `loading
# model`: a job process spends its first seconds starting and importing torch before its trainer
# says so, and the last run's phase is not this one's.
_CLAIM = """
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
_CLAIM = FAIR + FEED_EVENT + _CLAIM

# KEYS: job, events, metrics list, lease; ARGV: step, now, metrics json, event data, row json,
# lease token. Publishes only past the last published step: a resumed run redoes steps it
# already reported.
_PUBLISH_STEP = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local last = redis.call('HGET', KEYS[1], 'step')
if last and tonumber(ARGV[1]) <= tonumber(last) then return 0 end
redis.call('HSET', KEYS[1], 'step', ARGV[1], 'metrics', ARGV[3], 'updated_at', ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[5])
redis.call('XADD', KEYS[2], '*', 'type', 'metrics', 'data', ARGV[4])
return 1
"""
_PUBLISH_STEP = _fenced(_PUBLISH_STEP, lease=4, token=6)

# KEYS: job, events, rows list, lease; ARGV: step, now, event data, row json, the hash field
# holding the last published step of this kind, event type, rows kept (0: all), lease token. A
# step's `eval` or `samples`: same once-only rule as metrics, by a step field of its own; the
# list keeps its newest rows.
_PUBLISH_RESULT = """
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
_PUBLISH_RESULT = _fenced(_PUBLISH_RESULT, lease=4, token=8)

SAMPLES_KEPT = 1000
"""Newest `samples` rows a job keeps for `GET /v1/jobs/{id}/samples` (each up to
log_samples_count triples of a few KB): samples show what the model writes now, not a full
history, and a long run logging every step must not grow Redis without bound."""

# KEYS: job, events, lease, webhook feed; ARGV: step, now, event data, lease token. Same
# once-only rule for checkpoint events, and the same refusal once the job is no longer running
# (its worker may still hold the lease a moment after ending it: no checkpoint after its `done`).
_PUBLISH_CHECKPOINT = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local last = redis.call('HGET', KEYS[1], 'checkpoint_step')
if last and tonumber(ARGV[1]) <= tonumber(last) then return 0 end
redis.call('HSET', KEYS[1], 'checkpoint_step', ARGV[1], 'updated_at', ARGV[2])
job_event(KEYS[2], KEYS[4], KEYS[1], 'checkpoint', ARGV[3])
return 1
"""
_PUBLISH_CHECKPOINT = FEED_EVENT + _fenced(_PUBLISH_CHECKPOINT, lease=3, token=4)

# KEYS: job, events, lease; ARGV: phase json, event data, now, lease token. What a running job
# is doing (`core.training.callbacks.PHASES`): the record's `phase` and a `phase` event. Not
# once-only: a phase may come again (training after each evaluation), and a retried one repeats
# harmlessly.
_PUBLISH_PHASE = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'phase', ARGV[1], 'updated_at', ARGV[3])
redis.call('XADD', KEYS[2], '*', 'type', 'phase', 'data', ARGV[2])
return 1
"""
_PUBLISH_PHASE = _fenced(_PUBLISH_PHASE, lease=3, token=4)

# KEYS: job, lease; ARGV: {tracker: run} (JSON), lease token. The experiment-tracker runs a
# running job reports to (`core.tracking`), merged into its record's `trackers`.
_PUBLISH_TRACKERS = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local known = redis.call('HGET', KEYS[1], 'trackers')
local runs = known and cjson.decode(known) or {}
for name, run in pairs(cjson.decode(ARGV[1])) do runs[name] = run end
redis.call('HSET', KEYS[1], 'trackers', cjson.encode(runs))
return 1
"""
_PUBLISH_TRACKERS = _fenced(_PUBLISH_TRACKERS, lease=2, token=2)

# KEYS: job, lease; ARGV: lease token. The worker carries out a pending pause (not while a cancel
# is pending: the cancel wins): from now on the job is stopping for it, and a resume that
# withdraws the pause says so (`pdppo.store.jobs.steering`) rather than that the job runs on.
_BEGIN_PAUSE = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
if redis.call('HGET', KEYS[1], 'pause_requested') ~= '1' then return 0 end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return 0 end
redis.call('HSET', KEYS[1], 'pause_stopping', '1')
return 1
"""
_BEGIN_PAUSE = _fenced(_BEGIN_PAUSE, lease=2, token=1)

# KEYS: events, lease; ARGV: type, data, entries looked through, lease token. A job process's log
# line, exactly once through a stall (`pdppo.store.retry.add_event_once`), and only while fenced.
_ADD_LOG_ONCE = _fenced(_ADD_ONCE, lease=2, token=4)

# KEYS: job, events, tenant active, running, outbox, stats, webhook feed; ARGV: id, status, now,
# status data,
# done data, then field/value pairs (error, final model). A finished job never changes again.
_FINISH = """
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
_FINISH = FAIR + COUNT_END + FEED_EVENT + _FINISH

# KEYS: job, events, lease, running, tenant active, outbox, stats, webhook feed; ARGV: id, now,
# queued data, log data, cancelled data, done data, lease token of the caller ('' for none), most
# worker losses, failed data, failed done data, failure message, outbox check time, paused data,
# paused log data, stall gap ms ('' for no clock stamp), stall hold ms; KEYS 9, 10: the store's
# clock and stall keys (`pdppo.store.jobs.clock`). A reaper (no token) finding a running job while a
# stall is held answers 'held' and changes nothing: its holder may be alive, and hands it back with
# the true reason. A running job whose lease expired lost its worker (or the holder hands it back):
# back to queued and into the outbox (the caller re-sends the task; a dispatcher does if the caller
# dies first), straight to cancelled if a cancel was pending, paused if a pause was
# (`pdppo.store.jobs.steering`), or failed once it has lost more workers than allowed (a job that
# kills its worker, e.g. out of memory, must not take down every worker in turn forever).
_REQUEUE = """
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
_REQUEUE = FAIR + COUNT_END + FEED_EVENT + STORE_TICK + _REQUEUE


class JobStore:
    """What the workers do to jobs, over the synchronous client (decode_responses=True).

    It owns the client; the per-resource stores it builds (`events`, `outbox`) share it.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self.events = EventStore(client)
        self.outbox = Outbox(client)
        self.fair = FairQueue(client)
        self._claim = client.register_script(_CLAIM)
        self._publish_step = client.register_script(_PUBLISH_STEP)
        self._publish_checkpoint = client.register_script(_PUBLISH_CHECKPOINT)
        self._publish_result = client.register_script(_PUBLISH_RESULT)
        self._publish_phase = client.register_script(_PUBLISH_PHASE)
        self._add_log_once = client.register_script(_ADD_LOG_ONCE)
        self._begin_pause = client.register_script(_BEGIN_PAUSE)
        self._publish_trackers = client.register_script(_PUBLISH_TRACKERS)
        self._finish = client.register_script(_FINISH)
        self._requeue = client.register_script(_REQUEUE)

    def get(self, job_id: str) -> JobRecord | None:
        return _record_or_none(cast(dict[str, str], self.redis.hgetall(job_key(job_id))))

    def claim(self, job_id: str, worker: str) -> bool:
        keys = [job_key(job_id), events_key(job_id), RUNNING_SET, OUTBOX, WEBHOOK_FEED]
        args = [job_id, now_iso(), worker, _status_data("running"), STARTING_PHASE]
        return bool(self._claim(keys=keys, args=args))

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
        keys = [job_key(job_id), lease_key(job_id)]
        return _checked(job_id, "the pause", self._begin_pause(keys=keys, args=[lease_token]))

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
        metrics_json = json.dumps(metrics)
        event = json.dumps({"step": step, "total": total, "metrics": metrics})
        row = json.dumps({"step": step, "metrics": metrics})
        keys = [job_key(job_id), events_key(job_id), metrics_key(job_id), lease_key(job_id)]
        args: list[str | int] = [step, now_iso(), metrics_json, event, row, lease_token]
        return _checked(job_id, f"step {step}", self._publish_step(keys=keys, args=args))

    def publish_checkpoint(
        self, job_id: str, step: int, name: str, *, lease_token: str = ""
    ) -> bool:
        """Checkpoint `name` of step `step`, once; False when the job is no longer running (or
        the step is not past the last one recorded)."""
        data = json.dumps({"step": step, "name": name})
        keys = [job_key(job_id), events_key(job_id), lease_key(job_id), WEBHOOK_FEED]
        result = self._publish_checkpoint(keys=keys, args=[step, now_iso(), data, lease_token])
        return _checked(job_id, f"checkpoint {step}", result)

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
        event = json.dumps({"step": step, "total": total, "metrics": metrics})
        row = json.dumps({"step": step, "metrics": metrics})
        keys = [job_key(job_id), events_key(job_id), eval_key(job_id), lease_key(job_id)]
        args: list[str | int] = [step, now_iso(), event, row, "eval_step", "eval", 0, lease_token]
        return _checked(job_id, f"evaluation {step}", self._publish_result(keys=keys, args=args))

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
        keys = [job_key(job_id), events_key(job_id), samples_key(job_id), lease_key(job_id)]
        args: list[str | int] = [
            step,
            now_iso(),
            data,
            data,
            "samples_step",
            "samples",
            SAMPLES_KEPT,
            lease_token,
        ]
        return _checked(job_id, f"samples {step}", self._publish_result(keys=keys, args=args))

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
        event = json.dumps({**phase, "at": at})
        keys = [job_key(job_id), events_key(job_id), lease_key(job_id)]
        args = [json.dumps(phase), event, at, lease_token]
        return _checked(job_id, f"phase {name}", self._publish_phase(keys=keys, args=args))

    def publish_trackers(
        self, job_id: str, runs: dict[str, dict[str, str]], *, lease_token: str = ""
    ) -> bool:
        """The tracker runs ({tracker: {run_id, url}}) the job reports to, into its record;
        False when the job is no longer running."""
        keys = [job_key(job_id), lease_key(job_id)]
        args = [json.dumps(runs), lease_token]
        return _checked(job_id, "tracker runs", self._publish_trackers(keys=keys, args=args))

    def add_log_once(self, job_id: str, fields: dict[str, str], *, lease_token: str) -> bool:
        """A job process's `log` entry (`pdppo.store.retry.log_fields`), added once however often
        it is retried (False: it was there already), and only while `lease_token` holds the
        lease (`FencedOut` otherwise). One attempt: the caller retries."""
        keys = [events_key(job_id), lease_key(job_id)]
        args: list[str | int] = [fields["type"], fields["data"], LOG_RECOVERY_WINDOW, lease_token]
        return _checked(job_id, "a log line", self._add_log_once(keys=keys, args=args))

    def publish_log(self, job_id: str, message: str) -> None:
        self.events.publish_log(job_id, message)

    def finish(self, job: JobRecord, status: str, extra: dict[str, str] | None = None) -> bool:
        pairs = [item for pair in (extra or {}).items() for item in pair]
        keys = [
            job_key(job.id),
            events_key(job.id),
            tenant_active_key(job.tenant),
            RUNNING_SET,
            OUTBOX,
            STATS,
            WEBHOOK_FEED,
        ]
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
        keys = [
            job_key(job.id),
            events_key(job.id),
            lease_key(job.id),
            RUNNING_SET,
            tenant_active_key(job.tenant),
            OUTBOX,
            STATS,
            WEBHOOK_FEED,
            STORE_CLOCK,
            STALL_SEEN,
        ]
        gap, hold = gap_and_hold_ms(lease_seconds) if lease_seconds is not None else ("", "")
        args: list[str | int | float] = [
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
            time.time() + dispatch_grace,
            _status_data("paused"),
            _log_data(
                f"paused at step {self.get_step(job.id)}; resume it with POST "
                f"/v1/jobs/{job.id}/resume (pdppo resume {job.id}) to continue from its "
                "last checkpoint"
            ),
            gap,
            hold,
        ]
        return str(self._requeue(keys=keys, args=args))

    def get_step(self, job_id: str) -> int:
        return int(cast(str | None, self.redis.hget(job_key(job_id), "step")) or 0)
