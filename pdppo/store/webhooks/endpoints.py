"""Webhook endpoints and their deliveries, as the API sees them: register, list, delete an
endpoint; read its delivery log; redeliver one; send a test event.

An endpoint is a hash per tenant (`tenant_webhook_key`: url, events, its signing secret sealed
with PDPPO_WEBHOOK_SECRET_KEYS (`pdppo.store.webhooks.sealing`)...) listed in the tenant's sorted
set; its id is drawn (`wh_` and 24 hex), so two tenants never share one, and a
tenant's reads only ever build keys under its own name. A delivery is one event for one endpoint
(`webhook_delivery_key`): its payload, status (`pending`, `delivered`, `failed` after the last
retry, `dropped` when its endpoint was deleted), attempts and the last few attempts' outcomes.
Pending deliveries sit in the due set (`WEBHOOK_DUE`) scored by when to attempt them; the
delivery workers (`pdppo.store.webhooks.deliveries`) take them from there. Each endpoint keeps a
log of its newest `LOG_KEPT` deliveries; an ended delivery expires after `DELIVERY_TTL_SECONDS`.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis.asyncio as aredis

from pdppo.store.keys import (
    WEBHOOK_DUE,
    now_iso,
    tenant_webhook_key,
    tenant_webhook_log_key,
    tenant_webhooks_key,
    webhook_delivery_key,
)
from pdppo.webhooks import TEST_EVENT, new_secret, payload

if TYPE_CHECKING:
    from pdppo.store.webhooks.sealing import SecretBox

LOG_KEPT = 1000
DELIVERY_TTL_SECONDS = 30 * 86400
ATTEMPTS_KEPT = 10
"""Outcomes of the last attempts a delivery keeps (its count of attempts is kept whole)."""


@dataclass(frozen=True)
class Endpoint:
    id: str
    url: str
    events: list[str]
    description: str
    created_at: str
    created_ms: int
    stored_secret: str  # as Redis holds it: sealed (`SecretBox.open` gives the secret)


@dataclass(frozen=True)
class Delivery:
    id: str
    webhook: str
    type: str
    status: str
    attempts: int
    created_at: str
    next_attempt_ms: int | None
    delivered_at: str | None
    last_status_code: int | None
    last_error: str | None
    history: list[dict[str, Any]]
    payload: str


def endpoint_of(raw: dict[str, str]) -> Endpoint | None:
    if not raw:
        return None
    return Endpoint(
        id=raw["id"],
        url=raw["url"],
        events=json.loads(raw["events"]),
        description=raw.get("description", ""),
        created_at=raw["created_at"],
        created_ms=int(raw["created_ms"]),
        stored_secret=raw["secret"],
    )


def delivery_of(raw: dict[str, str], due: float | None = None) -> Delivery | None:
    if not raw:
        return None
    code = raw.get("last_status_code") or ""
    return Delivery(
        id=raw["id"],
        webhook=raw["webhook"],
        type=raw["type"],
        status=raw["status"],
        attempts=int(raw.get("attempts", "0")),
        created_at=raw["created_at"],
        next_attempt_ms=int(due * 1000) if due is not None else None,  # only pending ones are due
        delivered_at=raw.get("delivered_at") or None,
        last_status_code=int(code) if code else None,
        last_error=raw.get("last_error") or None,
        history=json.loads(raw.get("history", "[]")),
        payload=raw["payload"],
    )


# KEYS: delivery, due set, endpoint's log; ARGV: due at (s), made at (ms), log kept, then the
# delivery's field/value pairs. A delivery is made once: routing an event again (its router died
# before acknowledging it) finds it made and leaves it as it is.
MAKE_DELIVERY = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], ARGV[1], redis.call('HGET', KEYS[1], 'id'))
redis.call('ZADD', KEYS[3], ARGV[2], redis.call('HGET', KEYS[1], 'id'))
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[3]) - 1)
return 1
"""

# KEYS: delivery, due set; ARGV: endpoint id, due at. Sends an ended delivery again, with a
# fresh round of retries; a pending one is brought forward to now.
_REDELIVER = """
if redis.call('HGET', KEYS[1], 'webhook') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'pending', 'tries', '0', 'token', '')
redis.call('PERSIST', KEYS[1])
redis.call('ZADD', KEYS[2], ARGV[2], redis.call('HGET', KEYS[1], 'id'))
return 1
"""

# KEYS: endpoint, tenant's endpoints, endpoint's log; ARGV: id.
_DELETE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

# KEYS: endpoint, tenant's endpoints; ARGV: id, most endpoints, created ms, field/value pairs.
_CREATE = """
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return 0 end
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
"""


def delivery_fields(
    delivery_id: str, tenant: str, webhook: str, event_type: str, body: str, made_ms: int
) -> list[str]:
    fields = {
        "id": delivery_id,
        "tenant": tenant,
        "webhook": webhook,
        "type": event_type,
        "payload": body,
        "status": "pending",
        "attempts": "0",
        "tries": "0",
        "created_at": now_iso(),
        "created_ms": str(made_ms),
    }
    return [item for pair in fields.items() for item in pair]


class AsyncWebhookStore:
    """Endpoints and deliveries over the API's client (decode_responses=True)."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._create = client.register_script(_CREATE)
        self._delete = client.register_script(_DELETE)
        self._make = client.register_script(MAKE_DELIVERY)
        self._redeliver = client.register_script(_REDELIVER)

    async def create(
        self,
        tenant: str,
        url: str,
        events: list[str],
        description: str,
        most: int,
        *,
        box: SecretBox,
    ) -> tuple[Endpoint, str] | None:
        """The new endpoint and its signing secret (shown this once: Redis keeps it sealed
        with `box`); None past `most`."""
        webhook_id = f"wh_{secrets.token_hex(12)}"
        made_ms = int(time.time() * 1000)
        secret = new_secret()
        fields = {
            "id": webhook_id,
            "url": url,
            "events": json.dumps(events),
            "description": description,
            "created_at": now_iso(),
            "created_ms": str(made_ms),
            "secret": box.seal(secret),
        }
        flat = [item for pair in fields.items() for item in pair]
        keys = [tenant_webhook_key(tenant, webhook_id), tenant_webhooks_key(tenant)]
        if not await self._create(keys=keys, args=[webhook_id, most, made_ms, *flat]):
            return None
        endpoint = endpoint_of(fields)
        assert endpoint is not None
        return endpoint, secret

    async def get(self, tenant: str, webhook_id: str) -> Endpoint | None:
        raw = await self.redis.hgetall(tenant_webhook_key(tenant, webhook_id))
        return endpoint_of(cast(dict[str, str], raw))

    async def all(self, tenant: str) -> list[Endpoint]:
        ids = cast(list[str], await self.redis.zrange(tenant_webhooks_key(tenant), 0, -1))
        pipe = self.redis.pipeline(transaction=False)
        for webhook_id in ids:
            pipe.hgetall(tenant_webhook_key(tenant, webhook_id))
        found = [endpoint_of(raw) for raw in await pipe.execute()]
        return [endpoint for endpoint in found if endpoint is not None]

    async def delete(self, tenant: str, webhook_id: str) -> bool:
        """Gone with its log; its pending deliveries are dropped when they come due."""
        keys = [
            tenant_webhook_key(tenant, webhook_id),
            tenant_webhooks_key(tenant),
            tenant_webhook_log_key(tenant, webhook_id),
        ]
        return bool(await self._delete(keys=keys, args=[webhook_id]))

    async def deliveries(
        self, tenant: str, webhook_id: str, limit: int, before: float | None = None
    ) -> tuple[list[Delivery], float | None]:
        """Newest first, `limit` of them made before `before` (ms; None: from the newest), and
        the cursor of the next page (None: no more)."""
        log = tenant_webhook_log_key(tenant, webhook_id)
        top = f"({before}" if before is not None else "+inf"
        rows = cast(
            list[tuple[str, float]],
            await self.redis.zrevrangebyscore(log, top, "-inf", 0, limit + 1, withscores=True),
        )
        page = rows[:limit]
        pipe = self.redis.pipeline(transaction=False)
        for delivery_id, _ in page:
            pipe.hgetall(webhook_delivery_key(delivery_id))
            pipe.zscore(WEBHOOK_DUE, delivery_id)
        replies = await pipe.execute()
        found = [
            delivery_of(raw, due) for raw, due in zip(replies[0::2], replies[1::2], strict=True)
        ]
        items = [delivery for delivery in found if delivery is not None]
        return items, (page[-1][1] if len(rows) > limit else None)

    async def delivery(self, tenant: str, webhook_id: str, delivery_id: str) -> Delivery | None:
        raw = cast(dict[str, str], await self.redis.hgetall(webhook_delivery_key(delivery_id)))
        if raw.get("tenant") != tenant or raw.get("webhook") != webhook_id:
            return None
        due = await self.redis.zscore(WEBHOOK_DUE, delivery_id)
        return delivery_of(raw, due)

    async def redeliver(self, tenant: str, webhook_id: str, delivery_id: str) -> Delivery | None:
        if await self.delivery(tenant, webhook_id, delivery_id) is None:
            return None
        keys = [webhook_delivery_key(delivery_id), WEBHOOK_DUE]
        if not await self._redeliver(keys=keys, args=[webhook_id, time.time()]):
            return None
        return await self.delivery(tenant, webhook_id, delivery_id)

    async def send_test(self, tenant: str, endpoint: Endpoint) -> Delivery | None:
        """A `webhook.test` delivery, due now."""
        delivery_id = f"msg_{secrets.token_hex(16)}"
        made_ms = int(time.time() * 1000)
        body = payload(TEST_EVENT, delivery_id, made_ms, {"webhook": endpoint.id})
        fields = delivery_fields(
            delivery_id, tenant, endpoint.id, event_type=TEST_EVENT, body=body, made_ms=made_ms
        )
        keys = [
            webhook_delivery_key(delivery_id),
            WEBHOOK_DUE,
            tenant_webhook_log_key(tenant, endpoint.id),
        ]
        await self._make(keys=keys, args=[time.time(), made_ms, LOG_KEPT, *fields])
        return await self.delivery(tenant, endpoint.id, delivery_id)
