"""Webhook deliveries in the store, against a real redis-server: routing the feed's events to
the endpoints that asked for them (of their own tenant, registered before the event), routing an
event twice, the send tokens that let only the latest copy of a task attempt, and each outcome."""

from __future__ import annotations

import json
import time
from typing import Any, cast

import redis

from pdppo.store import JobStore
from pdppo.store.keys import (
    WEBHOOK_DUE,
    WEBHOOK_FEED,
    tenant_webhook_log_key,
    webhook_delivery_key,
)
from pdppo.store.webhooks.deliveries import GROUP, WebhookDeliveries
from pdppo.store.webhooks.endpoints import Endpoint
from pdppo.webhooks import delivery_id
from tests.support.seed import seed_job
from tests.support.stack import RedisServer
from tests.support.webhooks import BOX, on_api

JOB = "0000000000aa0000000000f1"


def register(server: RedisServer, tenant: str, events: list[str]) -> Endpoint:
    made = on_api(
        server,
        lambda s: s.create(tenant, "https://example.com/hook", events, "", most=5, box=BOX),
    )
    assert made is not None
    return made[0]


def end_job(client: redis.Redis, tenant: str = "a", status: str = "succeeded") -> None:
    seed_job(client, JOB, "running", tenant=tenant, name="nightly", step="7", total_steps="10")
    store = JobStore(client)
    extra = {"error_code": "training_error", "error_message": "boom"} if status == "failed" else {}
    assert store.finish(cast(Any, store.get(JOB)), status, extra)


def deliveries_of(client: redis.Redis) -> dict[str, dict[str, str]]:
    ids = cast(list[str], client.zrange(WEBHOOK_DUE, 0, -1))
    return {i: cast(dict[str, str], client.hgetall(webhook_delivery_key(i))) for i in ids}


def test_an_event_goes_to_its_tenants_endpoints_that_asked_for_its_type(
    client: redis.Redis, server: RedisServer
) -> None:
    wanted = register(server, "a", ["job.succeeded", "fine_tuning.job.succeeded"])
    register(server, "a", ["job.failed"])
    register(server, "b", ["job.succeeded", "job.failed"])  # same URL, another tenant
    end_job(client)
    routes = WebhookDeliveries(client)
    routes.ensure_group()

    assert routes.route("r1") == 2
    made = deliveries_of(client)
    entry_id = cast(list[tuple[str, Any]], client.xrange(WEBHOOK_FEED))[-1][0]
    ours = delivery_id(entry_id, wanted.id, "job.succeeded")
    openai = delivery_id(entry_id, wanted.id, "fine_tuning.job.succeeded")
    assert sorted(made) == sorted([ours, openai])
    assert {d["webhook"] for d in made.values()} == {wanted.id}
    body = json.loads(made[ours]["payload"])
    assert body["type"] == "job.succeeded"
    assert body["data"] == {
        "id": JOB,
        "object": "job",
        "name": "nightly",
        "status": "succeeded",
        "step": 7,
        "total_steps": 10,
    }
    assert json.loads(made[openai]["payload"])["data"] == {"id": f"ftjob-{JOB}"}
    logged = client.zrange(tenant_webhook_log_key("a", wanted.id), 0, -1, withscores=True)
    assert sorted(i for i, _ in logged) == sorted(made)  # the endpoint's log, by when made
    assert all(abs(ms - time.time() * 1000) < 5000 for _, ms in logged)
    assert routes.route("r1") == 0  # acknowledged: nothing left to route


def test_a_failed_job_event_carries_its_error(client: redis.Redis, server: RedisServer) -> None:
    register(server, "a", ["job.failed"])
    end_job(client, status="failed")
    routes = WebhookDeliveries(client)
    routes.ensure_group()
    assert routes.route("r1") == 1
    (made,) = deliveries_of(client).values()
    data = json.loads(made["payload"])["data"]
    assert data["error"] == {"code": "training_error", "message": "boom"}


def test_an_event_a_dead_router_took_is_routed_once_by_another(
    client: redis.Redis, server: RedisServer
) -> None:
    register(server, "a", ["job.succeeded"])
    end_job(client)
    routes = WebhookDeliveries(client)
    routes.ensure_group()
    taken = client.xreadgroup(GROUP, "dead", {WEBHOOK_FEED: ">"}, 10)  # and never acknowledged
    assert len(cast(list[Any], taken)[0][1]) == 1  # its succeeded entry

    assert routes.route("live", claim_idle_ms=60_000) == 0  # not idle long enough yet
    assert routes.route("live", claim_idle_ms=0) == 1
    assert routes.route("live", claim_idle_ms=0) == 0
    assert cast(dict[str, Any], client.xpending(WEBHOOK_FEED, GROUP))["pending"] == 0
    assert len(deliveries_of(client)) == 1


def test_an_endpoint_hears_only_what_happens_after_it_was_registered(
    client: redis.Redis, server: RedisServer
) -> None:
    end_job(client)
    time.sleep(0.002)  # the feed's ids and endpoints' stamps are in milliseconds
    register(server, "a", ["job.succeeded"])
    routes = WebhookDeliveries(client)
    routes.ensure_group()
    assert routes.route("r1") == 0


def test_only_the_latest_send_of_a_delivery_attempts_it_and_records_once(
    client: redis.Redis, server: RedisServer
) -> None:
    register(server, "a", ["job.succeeded"])
    end_job(client)
    routes = WebhookDeliveries(client)
    routes.ensure_group()
    routes.route("r1")
    (first,) = routes.take_due(30, now=1e10)
    assert routes.take_due(30, now=1e10) == []  # held
    (second,) = routes.take_due(30, now=1e10 + 31)  # its hold ran out: sent again
    assert first[0] == second[0] and first[1] != second[1]

    assert routes.begin(*first, hold_seconds=30) is None  # superseded
    attempt = routes.begin(*second, hold_seconds=30)
    assert attempt is not None and attempt.endpoint is not None and attempt.tries == 0
    assert routes.record(attempt, "retry", retry_at=123.0, status_code=500, error="HTTP 500")
    assert not routes.record(attempt, "delivered", status_code=200)  # recorded already
    raw = cast(dict[str, str], client.hgetall(webhook_delivery_key(attempt.id)))
    assert (raw["status"], raw["attempts"], raw["tries"], raw["last_status_code"]) == (
        "pending",
        "1",
        "1",
        "500",
    )
    assert client.zscore(WEBHOOK_DUE, attempt.id) == 123.0


def test_each_outcome_settles_the_delivery(client: redis.Redis, server: RedisServer) -> None:
    endpoint = register(server, "a", ["job.succeeded"])
    register(server, "a", ["job.succeeded"])
    register(server, "a", ["job.succeeded"])
    end_job(client)
    routes = WebhookDeliveries(client)
    routes.ensure_group()
    assert routes.route("r1") == 3
    sent = routes.take_due(30, now=1e10)
    on_api(server, lambda s: s.delete("a", endpoint.id))
    attempts = [routes.begin(*one, hold_seconds=30) for one in sent]
    outcomes: dict[str, str] = {}
    for attempt in attempts:
        assert attempt is not None
        if attempt.endpoint is None:
            outcome = "dropped"
        else:
            outcome = "delivered" if "delivered" not in outcomes.values() else "failed"
        assert routes.record(attempt, outcome, status_code=200)
        outcomes[attempt.id] = outcome

    assert sorted(outcomes.values()) == ["delivered", "dropped", "failed"]
    for delivery, outcome in outcomes.items():
        key = webhook_delivery_key(delivery)
        assert client.hget(key, "status") == outcome
        assert client.zscore(WEBHOOK_DUE, delivery) is None
        assert 0 < cast(int, client.ttl(key)) <= 30 * 86400
        assert client.hget(key, "attempts") == ("0" if outcome == "dropped" else "1")


def test_redeliver_sends_an_ended_delivery_again_with_fresh_retries(
    client: redis.Redis, server: RedisServer
) -> None:
    endpoint = register(server, "a", ["job.succeeded"])
    end_job(client)
    routes = WebhookDeliveries(client)
    routes.ensure_group()
    routes.route("r1")
    (sent,) = routes.take_due(30, now=1e10)
    attempt = routes.begin(*sent, hold_seconds=30)
    assert attempt is not None
    routes.record(attempt, "failed", status_code=503, error="HTTP 503")

    other = on_api(server, lambda s: s.redeliver("b", endpoint.id, attempt.id))
    assert other is None  # another tenant's: not found
    again = on_api(server, lambda s: s.redeliver("a", endpoint.id, attempt.id))
    assert again is not None
    assert (again.status, again.attempts, again.last_status_code) == ("pending", 1, 503)
    assert client.hget(webhook_delivery_key(attempt.id), "tries") == "0"
    assert client.ttl(webhook_delivery_key(attempt.id)) == -1
    (resent,) = routes.take_due(30)
    assert resent[0] == attempt.id


def test_entries_of_no_tenant_or_no_webhook_type_are_acknowledged_and_make_nothing(
    client: redis.Redis, server: RedisServer
) -> None:
    register(server, "a", ["job.succeeded", "job.failed", "job.checkpoint"])
    time.sleep(0.002)
    done = json.dumps({"status": "succeeded"})
    client.xadd(WEBHOOK_FEED, {"job": JOB, "tenant": "", "type": "status", "data": done})
    client.xadd(WEBHOOK_FEED, {"job": JOB, "tenant": "a", "type": "status", "data": "{}"})
    client.xadd(WEBHOOK_FEED, {"job": JOB, "tenant": "a", "type": "metrics", "data": done})
    routes = WebhookDeliveries(client)
    routes.ensure_group()
    assert routes.route("r1") == 0
    assert deliveries_of(client) == {}
    assert cast(dict[str, Any], client.xpending(WEBHOOK_FEED, GROUP))["pending"] == 0
