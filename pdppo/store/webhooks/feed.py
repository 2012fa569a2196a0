"""The webhook feed: every job's status changes and checkpoints, in one stream, for webhooks.

Webhooks (`pdppo.store.webhooks.endpoints`) must hear of every job event of every tenant that has an
endpoint, and of none twice, whichever process made it: the API (create, cancel, pause,
resume), a worker (claim, finish, requeue) or a job process (checkpoint). So the Lua scripts that
make those changes add the event to the feed themselves, in the same script as the change and
its entry in the job's own stream (`job_event` below): a change made is a change fed, whoever
crashes right after. A router (`WebhookRouter`, in the webhook workers) reads the feed through a
consumer group and turns each entry into deliveries.

Why one global stream rather than reading the jobs' own streams: those have no index to tail
across jobs, and a per-tenant check inside the scripts would read keys the scripts do not
declare. The feed costs one XADD per status change (a handful per job), capped at
`FEED_MAX_ENTRIES` (approximate trimming): a deployment that runs no webhook worker keeps at most
that many, and one whose routers are down while more events than that happen loses the oldest.
"""

from __future__ import annotations

FEED_MAX_ENTRIES = 100_000

# `job_event(events key, feed key, job key, type, data)`: the event in the job's stream and in
# the feed (with the job's id and tenant, read from its record).
FEED_EVENT = f"""
local function job_event(events, feed, job, kind, data)
  redis.call('XADD', events, '*', 'type', kind, 'data', data)
  redis.call('XADD', feed, 'MAXLEN', '~', {FEED_MAX_ENTRIES}, '*',
             'job', redis.call('HGET', job, 'id') or '', 'tenant',
             redis.call('HGET', job, 'tenant') or '', 'type', kind, 'data', data)
end
"""
