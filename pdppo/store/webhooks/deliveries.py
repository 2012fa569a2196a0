"""What the webhook workers do in the store: route the feed's events into deliveries, take the
deliveries that are due, and record each attempt's outcome.

Routing (`route`) reads the feed (`pdppo.store.webhooks.feed`) through one consumer group, so of
several webhook workers each event goes to one; an event is acknowledged only after its deliveries
are made, and making one is idempotent (its id derives from the event, the endpoint and the type),
so a router that dies mid-event leaves it pending, another router claims it after `CLAIM_IDLE_MS`
and makes what was missing. An endpoint receives the events that happen after it was registered, of
the types it subscribed to, for its own tenant's jobs.

Sending. A due delivery is taken (`take_due`) with a fresh send token, and its due time moved
`hold` seconds on; the taker sends a Celery task carrying the token. The task starts the attempt
(`begin`: only if the token is still the delivery's, so of two copies of a task, one re-sent
after its hold ran out while the first waited in the queue, only the latest attempts) and records
the outcome (`record`). A worker killed mid-attempt records nothing: the delivery comes due again
when its hold ends and is sent again, so no event is lost, and a receiver may see one twice (the
`webhook-id` is the same: Standard Webhooks' receivers deduplicate on it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, cast

import redis

from pdppo.store.keys import (
    WEBHOOK_DUE,
    WEBHOOK_FEED,
    job_key,
    now_iso,
    tenant_webhook_key,
    tenant_webhook_log_key,
    tenant_webhooks_key,
    webhook_delivery_key,
)
from pdppo.store.webhooks.endpoints import (
    ATTEMPTS_KEPT,
    DELIVERY_TTL_SECONDS,
    LOG_KEPT,
    MAKE_DELIVERY,
    Endpoint,
    delivery_fields,
    endpoint_of,
)
from pdppo.webhooks import delivery_id, event_types_of, payload

GROUP = "webhooks"
BATCH = 100
"""Events a router takes, and due deliveries a scheduler sends, per round trip."""
CLAIM_IDLE_MS = 60_000
"""An event a router took this long ago and never acknowledged: its router died; claim it."""

# KEYS: due set, then one delivery per id; ARGV: now, hold until, then the ids. Each delivery
# still due is held until `hold until` and given a new send token (returned with it).
_TAKE_DUE = """
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= tonumber(ARGV[1]) then
    if redis.call('HGET', KEYS[i - 1], 'status') == 'pending' then
      local token = tostring(redis.call('HINCRBY', KEYS[i - 1], 'sends', 1))
      redis.call('HSET', KEYS[i - 1], 'token', token)
      redis.call('ZADD', KEYS[1], ARGV[2], id)
      out[#out + 1] = id
      out[#out + 1] = token
    else
      redis.call('ZREM', KEYS[1], id)
    end
  end
end
return out
"""

# KEYS: delivery, due set; ARGV: token, hold until. An attempt starts only with the delivery's
# latest token, while it is pending; its hold is renewed to cover the attempt.
_BEGIN = """
if redis.call('HGET', KEYS[1], 'status') ~= 'pending' then return 0 end
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('ZADD', KEYS[2], 'XX', ARGV[2], redis.call('HGET', KEYS[1], 'id'))
return 1
"""

# KEYS: delivery, due set; ARGV: token, outcome (delivered, retry, failed, dropped), now, retry
# at, attempt json, status code, error, attempts kept, ttl. Only the attempt `begin` started
# records (a stale copy finds another token), and only once.
_RECORD = """
if redis.call('HGET', KEYS[1], 'status') ~= 'pending' then return 0 end
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local id = redis.call('HGET', KEYS[1], 'id')
redis.call('HSET', KEYS[1], 'token', '')
if ARGV[2] == 'dropped' then
  redis.call('HSET', KEYS[1], 'status', 'dropped')
else
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  redis.call('HINCRBY', KEYS[1], 'tries', 1)
  local history = cjson.decode(redis.call('HGET', KEYS[1], 'history') or '[]')
  history[#history + 1] = cjson.decode(ARGV[5])
  while #history > tonumber(ARGV[8]) do table.remove(history, 1) end
  redis.call('HSET', KEYS[1], 'history', cjson.encode(history), 'last_status_code', ARGV[6],
             'last_error', ARGV[7])
end
if ARGV[2] == 'retry' then
  redis.call('ZADD', KEYS[2], ARGV[4], id)
  return 1
end
if ARGV[2] == 'delivered' then
  redis.call('HSET', KEYS[1], 'status', 'delivered', 'delivered_at', ARGV[3])
elseif ARGV[2] == 'failed' then
  redis.call('HSET', KEYS[1], 'status', 'failed')
end
redis.call('ZREM', KEYS[2], id)
redis.call('EXPIRE', KEYS[1], ARGV[9])
return 1
"""


@dataclass(frozen=True)
class Attempt:
    """A delivery to attempt now: what to send, and where (None: its endpoint is gone)."""

    id: str
    token: str
    type: str
    payload: str
    tries: int
    endpoint: Endpoint | None


class WebhookDeliveries:
    """The webhook workers' side, over a synchronous client (decode_responses=True)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._make = client.register_script(MAKE_DELIVERY)
        self._take_due = client.register_script(_TAKE_DUE)
        self._begin = client.register_script(_BEGIN)
        self._record = client.register_script(_RECORD)

    def ensure_group(self) -> None:
        """The routers' group on the feed, from its first entry (events fed before any webhook
        worker ran are routed too: endpoints registered by then receive them)."""
        try:
            self.redis.xgroup_create(WEBHOOK_FEED, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def route(
        self,
        consumer: str,
        count: int = BATCH,
        block_ms: int | None = None,
        claim_idle_ms: int = CLAIM_IDLE_MS,
    ) -> int:
        """Route the events this consumer takes (waiting up to `block_ms` for one), then those
        another router took and left `claim_idle_ms` ago; returns the deliveries made."""
        replies = cast(
            list[Any],
            self.redis.xreadgroup(GROUP, consumer, {WEBHOOK_FEED: ">"}, count, block_ms),
        )
        entries: list[tuple[str, dict[str, str] | None]] = []
        for _, stream_entries in replies or []:
            entries.extend(stream_entries)
        claimed = cast(
            list[Any],
            self.redis.xautoclaim(
                WEBHOOK_FEED, GROUP, consumer, claim_idle_ms, start_id="0-0", count=count
            ),
        )
        entries.extend(claimed[1])
        made = 0
        for entry_id, fields in entries:
            if fields:  # None: trimmed from the feed before anyone routed it
                made += self._route_one(entry_id, fields)
            self.redis.xack(WEBHOOK_FEED, GROUP, entry_id)
        return made

    def _route_one(self, entry_id: str, fields: dict[str, str]) -> int:
        tenant, job_id, kind = fields.get("tenant", ""), fields.get("job", ""), fields["type"]
        data = json.loads(fields.get("data", "{}"))
        types = event_types_of(kind, data.get("status"))
        if not tenant or not types:
            return 0
        at_ms = int(entry_id.split("-")[0])
        made = 0
        for endpoint in self._endpoints(tenant):
            if endpoint.created_ms > at_ms:
                continue
            for event_type in types:
                if event_type in endpoint.events:
                    made += self._make_one(
                        entry_id, tenant, endpoint, event_type=event_type, job_id=job_id, data=data
                    )
        return made

    def _endpoints(self, tenant: str) -> list[Endpoint]:
        ids = cast(list[str], self.redis.zrange(tenant_webhooks_key(tenant), 0, -1))
        found = [
            endpoint_of(cast(dict[str, str], self.redis.hgetall(tenant_webhook_key(tenant, i))))
            for i in ids
        ]
        return [endpoint for endpoint in found if endpoint is not None]

    def _make_one(
        self,
        entry_id: str,
        tenant: str,
        endpoint: Endpoint,
        event_type: str,
        job_id: str,
        data: dict[str, Any],
    ) -> int:
        message_id = delivery_id(entry_id, endpoint.id, event_type)
        body = payload(event_type, message_id, int(entry_id.split("-")[0]), self._job(job_id, data))
        made_ms = int(time.time() * 1000)
        fields = delivery_fields(
            message_id, tenant, endpoint.id, event_type=event_type, body=body, made_ms=made_ms
        )
        keys = [
            webhook_delivery_key(message_id),
            WEBHOOK_DUE,
            tenant_webhook_log_key(tenant, endpoint.id),
        ]
        return int(cast(int, self._make(keys=keys, args=[time.time(), made_ms, LOG_KEPT, *fields])))

    def _job(self, job_id: str, data: dict[str, Any]) -> dict[str, object]:
        """The payload's `data`: the job as of this event (its status from the event itself:
        the job may have moved on since)."""
        name, step, total, code, message = cast(
            list[str | None],
            self.redis.hmget(
                job_key(job_id), ["name", "step", "total_steps", "error_code", "error_message"]
            ),
        )
        job: dict[str, object] = {"id": job_id, "object": "job", "name": name}
        if "status" in data:
            job["status"] = data["status"]
            job["step"] = int(step) if step else 0
            job["total_steps"] = int(total) if total else None
            if data["status"] == "failed":
                job["error"] = {"code": code, "message": message}
        else:  # a checkpoint
            job["checkpoint"] = {"step": data.get("step"), "name": data.get("name")}
        return job

    def take_due(
        self, hold_seconds: float, *, now: float | None = None, limit: int = BATCH
    ) -> list[tuple[str, str]]:
        """(delivery id, send token) of the deliveries due now, each held `hold_seconds`."""
        now = time.time() if now is None else now
        ids = cast(list[str], self.redis.zrangebyscore(WEBHOOK_DUE, "-inf", now, 0, limit))
        if not ids:
            return []
        keys = [WEBHOOK_DUE, *(webhook_delivery_key(i) for i in ids)]
        flat = cast(list[str], self._take_due(keys=keys, args=[now, now + hold_seconds, *ids]))
        return list(zip(flat[0::2], flat[1::2], strict=True))

    def begin(self, delivery: str, token: str, hold_seconds: float) -> Attempt | None:
        """The attempt to make, or None: the delivery ended, or a later send superseded this."""
        key = webhook_delivery_key(delivery)
        if not self._begin(keys=[key, WEBHOOK_DUE], args=[token, time.time() + hold_seconds]):
            return None
        raw = cast(dict[str, str], self.redis.hgetall(key))
        endpoint = endpoint_of(
            cast(
                dict[str, str],
                self.redis.hgetall(tenant_webhook_key(raw["tenant"], raw["webhook"])),
            )
        )
        return Attempt(
            id=delivery,
            token=token,
            type=raw["type"],
            payload=raw["payload"],
            tries=int(raw.get("tries", "0")),
            endpoint=endpoint,
        )

    def record(
        self,
        attempt: Attempt,
        outcome: str,
        *,
        retry_at: float = 0.0,
        status_code: int | None = None,
        error: str = "",
        duration_ms: float = 0.0,
    ) -> bool:
        """Record `outcome` (delivered, retry at `retry_at`, failed, dropped) of `attempt`."""
        moment = now_iso()
        entry: dict[str, object] = {
            "at": moment,
            "status_code": status_code,
            "error": error or None,
            "duration_ms": round(duration_ms, 1),
        }
        args: list[str | float | int] = [
            attempt.token,
            outcome,
            moment,
            retry_at,
            json.dumps(entry),
            "" if status_code is None else status_code,
            error,
            ATTEMPTS_KEPT,
            DELIVERY_TTL_SECONDS,
        ]
        keys = [webhook_delivery_key(attempt.id), WEBHOOK_DUE]
        return bool(self._record(keys=keys, args=args))
