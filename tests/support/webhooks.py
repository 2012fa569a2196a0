"""Webhook deliveries for the store's and the worker's tests: the secret box their endpoints
are sealed with, the async store on a test's redis-server, and one attempt and its state."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import redis
import redis.asyncio as aredis
from cryptography.fernet import Fernet

from pdppo.settings import Settings
from pdppo.store import JobStore
from pdppo.store.keys import (
    webhook_delivery_key,
)
from pdppo.store.webhooks.deliveries import Attempt, WebhookDeliveries
from pdppo.store.webhooks.endpoints import AsyncWebhookStore
from pdppo.store.webhooks.sealing import SecretBox
from tests.support.seed import seed_job
from tests.support.stack import RedisServer


def on_api(server: RedisServer, work: Callable[[AsyncWebhookStore], Awaitable[T]]) -> T:
    async def main() -> T:
        conn = aredis.Redis.from_url(server.url(), decode_responses=True)
        try:
            return await work(AsyncWebhookStore(conn))
        finally:
            await conn.aclose()

    return asyncio.run(main())


KEY = Fernet.generate_key()  # PDPPO_WEBHOOK_SECRET_KEYS of these tests


BOX = SecretBox([KEY])  # what seals endpoints' secrets with it


def settings(schedule: str = "5,300", allowed: str = "127.0.0.0/8") -> Settings:
    return Settings(  # type: ignore[call-arg]
        webhook_secret_keys=KEY.decode(),
        webhook_allowed_networks=allowed,
        webhook_retry_schedule=schedule,
        webhook_timeout_seconds=2,
        _env_file=None,
    )


def attempt_to(
    client: redis.Redis, server: RedisServer, url: str
) -> tuple[WebhookDeliveries, Attempt]:
    """A delivery of a job's end to a new endpoint at `url`, begun."""
    made = on_api(server, lambda s: s.create("t", url, ["job.succeeded"], "", most=5, box=BOX))
    assert made is not None
    seed_job(client, JOB, "running", tenant="t")
    store = JobStore(client)
    job = store.get(JOB)
    assert job is not None and store.finish(job, "succeeded")
    routes = WebhookDeliveries(client)
    routes.ensure_group()
    assert routes.route("r") == 1
    (sent,) = routes.take_due(30)
    attempt = routes.begin(*sent, hold_seconds=30)
    assert attempt is not None
    return routes, attempt


def state(client: redis.Redis, attempt: Attempt) -> tuple[str | None, ...]:
    raw = cast(dict[str, str], client.hgetall(webhook_delivery_key(attempt.id)))
    return (raw["status"], raw["attempts"], raw.get("last_status_code"), raw.get("last_error"))


T = TypeVar("T")


JOB = "0000000000aa0000000000f2"
