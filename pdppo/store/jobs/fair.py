"""Fair order of the queued jobs: which job a worker that is free should start next.

Why. A worker takes a task from its Celery queue (a Redis list, first in first out, with
experiments' children at a lower priority: `workers.celery_app.task_priority`). In that order one
tenant's backlog makes every other tenant wait for all of it, and a steady stream of plain jobs
(which always go before children) starves every experiment, forever. So the task no longer names
the job its worker runs: a task is a turn on its queue, and the worker starts the job this index
says is next on that queue (`FairQueue.next`, `workers.tasks`), which takes turns

- between tenants: the one served least recently goes first (one never served, first of all;
  of several never served, the first to arrive);
- within a tenant, between its flows, the same way: its plain jobs are one flow, each of its
  experiments another (of flows never served, plain jobs first, so a job submitted beside an
  experiment does not wait behind its first child, then the experiments as they arrived);
- within a flow, in the order its jobs were created (ids are time-ordered; a job requeued after
  a lost worker or resumed after a pause takes its place again), except that a task whose own
  job is in the flow whose turn it is starts that job: the flow gets its turn either way, and
  its task need not be sent again (one flow's jobs, in whatever order their tasks come, never
  send a task twice).

"Served" is when the flow's job was claimed (`fair_started`, in the claim script): a turn is a
counter (`FAIR_TURN`, from 1) stamped on the tenant and the flow and kept (`...:served`), so a
tenant or flow that empties and comes back takes its place in the rotation, not its head (or it
could take the head with every job it submits). One never served scores below every turn, by
arrival (`FAIR_ARRIVALS`, less `NEVER`). Each job's task still exists (the outbox sees to that,
`pdppo.store.jobs.outbox`), so there are at least as many tasks as queued jobs: a task whose own
job waits while another one runs is given back to the head of its queue
(`workers.tasks.give_back`), a task that finds nothing queued does nothing.

Layout, per queue (jobs of different queues never share a worker): an active-tenants sorted set
scored by last turn, a hash of every tenant's last turn; per tenant an active-flows sorted set and
a hash of the flows' last turns; per flow a sorted set of its queued job ids (score 0: ordered by
id). Every script that queues a job adds it (`fair_enqueue`: create, requeue, resume, the
outbox's adoption of older jobs), claiming takes it out and stamps the turn, cancelling, pausing
or finishing a queued job takes it out (`fair_dropped`). The scripts build these keys from the
job's hash (queue, tenant, experiment) and `next` walks them, which is why they are not declared:
the index is for one Redis, as the deployment is (no cluster).
"""

from __future__ import annotations

import redis

from pdppo.store.keys import FAIR_ARRIVALS, FAIR_PREFIX, FAIR_TURN, PREFIX

PLAIN_FLOW = "jobs"
"""The flow of a tenant's jobs of no experiment (an experiment's children: `experiment:<id>`)."""
NEVER = 10**15
"""A score of one never served is its arrival less this: negative, exact in a double."""
LOOKED_AT = 1000
"""Most entries `next` looks at in one call: stale ones it meets (a job cancelled, paused or gone
that a script missed) are dropped on the way, and a backlog of those only delays the answer."""

# Lua helpers for the scripts that move a job in or out of the queue. `fair_names(job)`: the job's
# id, tenant and flow, and the keys of its queue's index. `fair_arrival()`: the score of a tenant or
# experiment never served (a plain flow never served: below those).
FAIR = f"""
local FAIR_PREFIX = '{FAIR_PREFIX}'
local FAIR_TURN = '{FAIR_TURN}'
local function fair_arrival()
  return redis.call('INCR', '{FAIR_ARRIVALS}') - {NEVER}
end
local function fair_names(job)
  local f = redis.call('HMGET', job, 'id', 'queue', 'tenant', 'experiment')
  local queue = f[2] or 'cpu'
  local flow = '{PLAIN_FLOW}'
  if f[4] and f[4] ~= '' then flow = 'experiment:' .. f[4] end
  local base = FAIR_PREFIX .. queue
  local flows = base .. ':tenant:' .. f[3]
  return {{id = f[1], tenant = f[3], flow = flow, tenants = base .. ':tenants',
          served = base .. ':served', flows = flows, flows_served = flows .. ':served',
          jobs = flows .. ':flow:' .. flow}}
end
local function fair_enqueue(job)
  local n = fair_names(job)
  if not n.id or not n.tenant then return end
  redis.call('ZADD', n.jobs, 0, n.id)
  if not redis.call('ZSCORE', n.flows, n.flow) then
    local score = redis.call('HGET', n.flows_served, n.flow)
    if not score and n.flow == '{PLAIN_FLOW}' then score = -2 * {NEVER} end
    redis.call('ZADD', n.flows, score or fair_arrival(), n.flow)
  end
  if not redis.call('ZSCORE', n.tenants, n.tenant) then
    local score = redis.call('HGET', n.served, n.tenant) or fair_arrival()
    redis.call('ZADD', n.tenants, score, n.tenant)
  end
end
local function fair_emptied(n)
  if redis.call('EXISTS', n.jobs) == 0 then
    redis.call('ZREM', n.flows, n.flow)
    if n.flow ~= '{PLAIN_FLOW}' then redis.call('HDEL', n.flows_served, n.flow) end
  end
  if redis.call('EXISTS', n.flows) == 0 then redis.call('ZREM', n.tenants, n.tenant) end
end
local function fair_started(job)
  local n = fair_names(job)
  if not n.id or not n.tenant or redis.call('ZREM', n.jobs, n.id) == 0 then return end
  local turn = redis.call('INCR', FAIR_TURN)
  redis.call('HSET', n.served, n.tenant, turn)
  redis.call('HSET', n.flows_served, n.flow, turn)
  redis.call('ZADD', n.flows, 'XX', turn, n.flow)
  redis.call('ZADD', n.tenants, 'XX', turn, n.tenant)
  fair_emptied(n)
end
local function fair_dropped(job)
  local n = fair_names(job)
  if not n.id or not n.tenant or redis.call('ZREM', n.jobs, n.id) == 0 then return end
  fair_emptied(n)
end
"""

# ARGV (`FairQueue.next` names them): queue, looked_at (most entries to look at), own (the asking
# task's job, '' for none). The queued job the index puts first on the queue (`own` if it is
# queued in the flow whose turn it is), or false; entries of jobs no longer queued are dropped.
_NEXT = f"""
local base = FAIR_PREFIX .. ARGV[1]
local tenants = base .. ':tenants'
for _ = 1, tonumber(ARGV[2]) do
  local tenant = redis.call('ZRANGE', tenants, 0, 0)[1]
  if not tenant then return false end
  local flows = base .. ':tenant:' .. tenant
  local flow = redis.call('ZRANGE', flows, 0, 0)[1]
  if not flow then
    redis.call('ZREM', tenants, tenant)
  else
    local jobs = flows .. ':flow:' .. flow
    local id = redis.call('ZRANGE', jobs, 0, 0)[1]
    if not id then
      redis.call('ZREM', flows, flow)
      if flow ~= '{PLAIN_FLOW}' then redis.call('HDEL', flows .. ':served', flow) end
    else
      local job = redis.call('HMGET', '{PREFIX}:job:' .. id, 'status', 'queue')
      if job[1] == 'queued' and (job[2] or 'cpu') == ARGV[1] then
        if ARGV[3] ~= '' and ARGV[3] ~= id and redis.call('ZSCORE', jobs, ARGV[3]) then
          local own = redis.call('HMGET', '{PREFIX}:job:' .. ARGV[3], 'status', 'queue')
          if own[1] == 'queued' and (own[2] or 'cpu') == ARGV[1] then return ARGV[3] end
        end
        return id
      end
      redis.call('ZREM', jobs, id)
    end
  end
end
return false
"""
_NEXT = FAIR + _NEXT


def flow_of(experiment: str | None) -> str:
    return f"experiment:{experiment}" if experiment else PLAIN_FLOW


class FairQueue:
    """The fair order over the workers' synchronous client (decode_responses=True)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._next = client.register_script(_NEXT)

    def next(self, queue: str, own: str | None = None) -> str | None:
        """The queued job of `queue` to start next, or None when the index has none. `own`: the
        job of the task asking, started instead of its flow's first when that flow is next."""
        args: dict[str, str | int] = {"queue": queue, "looked_at": LOOKED_AT, "own": own or ""}
        found = self._next(keys=[], args=list(args.values()))
        return str(found) if found else None
