"""The enqueue outbox: every queued job no worker has claimed yet, and when to check on its task.

Creating a job (Redis) and publishing its Celery task (the broker) are two writes that no
transaction spans (docs/developers/design.md#the-outbox): an API killed between them left jobs
`queued` forever, counted against their tenant's quota, and returned as they were to every
idempotent retry. The same gap opens on the worker's side: a worker that took the task and died
before it claimed the job left the message in kombu's `unacked` hash for the broker's visibility
timeout (an hour).

So the job's record and its outbox entry are written by the same script (`transitions.CREATE`,
and `REQUEUE` when a job goes back to the queue), and the entry stays until a worker claims the
job (`CLAIM`) or the job ends (`FINISH`, `CANCEL`). The score is the time (Unix seconds, the
clock kombu also uses for `unacked_index`) at which a dispatcher should next look at the job:
a few seconds after it was created or requeued, long enough for its creator to publish the task.
A dispatcher (`workers.upkeep.reaper.dispatch_once`, in every worker) takes due entries, and for
each
looks at the broker: a message waiting in the queue is left alone (a job behind a long queue is
not re-sent); one a worker took moments ago is given until that worker could have claimed it; one
taken longer ago than that (its taker died) is put back in the queue; and a job with no message
at all gets its task sent. A second delivery of one job is harmless (the lease and `CLAIM` make
it a no-op) but is avoided this way, as Celery does not deduplicate task ids.

Taking a due entry moves its score forward in the same script, so of several dispatchers exactly
one handles each check; every later adjustment only ever moves a check earlier (`ZADD ... LT`),
so no writer can postpone a check another one asked for. Scores come from the writers' clocks:
a skew between machines only makes a check early (it finds the task waiting and does nothing) or
late by the skew, and a consumer whose clock runs behind by more than the claim grace may see its
task put back while it claims the job, which the lease turns into a skipped duplicate.

Why an outbox rather than a reconciler that scans queued jobs: the tenants' active sets are the
only index of queued jobs, and scanning them all on every pass costs as much as the backlog; the
outbox holds exactly the jobs in doubt, ordered by when each needs a look, so an idle pass is one
`ZRANGEBYSCORE`.
"""

from __future__ import annotations

import time
from typing import cast

import redis

from pdppo.store.jobs.fair import FAIR
from pdppo.store.keys import OUTBOX, job_key, tenant_active_key

# How long after a job is created or requeued a dispatcher first checks that its task exists:
# enough for the API (or the reaper) to publish it, so that the check rarely sends a duplicate.
DEFAULT_GRACE_SECONDS = 5.0

# KEYS: outbox, then one job hash per id; ARGV: now, hold until, then the ids. Each entry still
# due is held (its next check moved to `hold until`) and returned with its queue if the job is
# still queued; an entry whose job is gone or no longer queued is dropped.
_TAKE_DUE = """
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= tonumber(ARGV[1]) then
    local job = redis.call('HMGET', KEYS[i - 1], 'status', 'queue')
    if job[1] == 'queued' then
      redis.call('ZADD', KEYS[1], ARGV[2], id)
      out[#out + 1] = id
      out[#out + 1] = job[2] or 'cpu'
    else
      redis.call('ZREM', KEYS[1], id)
    end
  end
end
return out
"""

# KEYS: outbox, then one job hash per id; ARGV: check at, then the ids. Queued jobs missing from
# the outbox (queued before it existed, or by a path that skipped it) are added; others untouched.
# Each queued job also enters the fair order (`pdppo.store.jobs.fair`), where it is if it was.
_ADOPT = """
local added = 0
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[i], 'status') == 'queued' then
    added = added + redis.call('ZADD', KEYS[1], 'NX', ARGV[1], ARGV[i])
    fair_enqueue(KEYS[i])
  end
end
return added
"""
_ADOPT = FAIR + _ADOPT


class Outbox:
    """The outbox over the workers' synchronous client (decode_responses=True)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._take_due = client.register_script(_TAKE_DUE)
        self._adopt = client.register_script(_ADOPT)

    def take_due(
        self, hold_seconds: float, *, now: float | None = None, limit: int = 200
    ) -> list[tuple[str, str]]:
        """The queued jobs whose check is due, as (job id, queue), each held for `hold_seconds`
        (the caller then checks its task, and may bring the next check forward)."""
        now = time.time() if now is None else now
        ids = cast(list[str], self.redis.zrangebyscore(OUTBOX, "-inf", now, start=0, num=limit))
        if not ids:
            return []
        keys = [OUTBOX, *(job_key(job_id) for job_id in ids)]
        flat = cast(list[str], self._take_due(keys=keys, args=[now, now + hold_seconds, *ids]))
        return list(zip(flat[0::2], flat[1::2], strict=True))

    def check_at(self, job_id: str, at: float) -> None:
        """Bring the job's next check forward to `at` (never later); nothing if it has no entry
        (claimed or finished meanwhile)."""
        self.redis.zadd(OUTBOX, {job_id: at}, xx=True, lt=True)

    def adopt_queued(self, at: float | None = None) -> int:
        """Add every queued job that has no entry yet (found through the tenants' active sets);
        returns how many. Run when a worker starts, so jobs stranded before the outbox existed
        are repaired too."""
        at = time.time() if at is None else at
        added = 0
        for active in self.redis.scan_iter(tenant_active_key("*"), count=500):
            ids = sorted(cast(set[str], self.redis.smembers(active)))
            for start in range(0, len(ids), 200):
                batch = ids[start : start + 200]
                keys = [OUTBOX, *(job_key(job_id) for job_id in batch)]
                added += int(cast(int, self._adopt(keys=keys, args=[at, *batch])))
        return added

    def size(self) -> int:
        return int(cast(int, self.redis.zcard(OUTBOX)))
