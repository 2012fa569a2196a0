"""`/v1/webhooks` in-process (the real app over ASGI, a real redis-server): the secret shown
once, URLs refused with their reason, the per-tenant limit, two tenants registering the same
URL, deliveries listed page by page, redeliver and test, and 404 for another tenant's ids."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from api.app import create_app
from api.routes import webhooks as webhook_routes
from pdppo.settings import Settings
from pdppo.store.keys import WEBHOOK_DUE
from tests.support.inprocess import KEYS, Request, send

PUBLIC = "https://93.184.216.34/hook"  # an address literal: no DNS needed


@pytest.fixture
def settings(redis_url: str, tmp_path: Path) -> Settings:
    redis.Redis.from_url(redis_url).flushdb()
    return Settings(  # type: ignore[call-arg]
        redis_url=redis_url,
        api_keys=",".join(f"{t}:{k}" for t, k in KEYS.items()),
        artifact_dir=tmp_path,
        max_webhooks_per_tenant=2,
        webhook_allowed_networks="127.0.0.0/8",
        _env_file=None,
    )


def post(tenant: str, path: str, body: dict[str, Any] | None = None) -> Request:
    return (tenant, "POST", path, {"json": body} if body is not None else {})


def get(tenant: str, path: str, **params: Any) -> Request:
    return (tenant, "GET", path, {"params": params} if params else {})


def test_the_secret_is_shown_once_and_each_tenant_sees_its_own(settings: Settings) -> None:
    made, again, listed, other = send(
        settings,
        post("alice", "/v1/webhooks", {"url": PUBLIC, "description": "ci"}),
        post("bob", "/v1/webhooks", {"url": PUBLIC, "events": ["job.failed"]}),
        get("alice", "/v1/webhooks"),
        get("bob", "/v1/webhooks"),
    )
    assert made.status_code == 201 and again.status_code == 201
    body = made.json()
    assert body["secret"].startswith("whsec_")
    assert (body["url"], body["events"], body["description"], body["object"]) == (
        PUBLIC,
        ["job.succeeded", "job.failed", "job.cancelled"],
        "ci",
        "webhook",
    )
    assert [w["id"] for w in listed.json()["items"]] == [body["id"]]
    assert "secret" not in listed.json()["items"][0]
    assert [w["id"] for w in other.json()["items"]] == [again.json()["id"]]
    assert again.json()["id"] != body["id"]
    hook = body["id"]
    mine, theirs, gone, after = send(
        settings,
        get("alice", f"/v1/webhooks/{hook}"),
        get("bob", f"/v1/webhooks/{hook}"),
        ("bob", "DELETE", f"/v1/webhooks/{hook}", {}),
        get("alice", f"/v1/webhooks/{hook}"),
    )
    assert mine.status_code == 200 and "secret" not in mine.json()
    assert theirs.status_code == 404 and gone.status_code == 404
    assert after.status_code == 200  # bob's delete touched nothing of alice's
    assert theirs.json() == {"detail": f"webhook {hook!r} not found"}
    deleted, missing = send(
        settings,
        ("alice", "DELETE", f"/v1/webhooks/{hook}", {}),
        get("alice", f"/v1/webhooks/{hook}"),
    )
    assert deleted.status_code == 204 and missing.status_code == 404


@pytest.mark.parametrize(
    ("url", "status", "detail"),
    [
        ("https://10.0.0.1/x", 400, "10.0.0.1, which is not a public address"),
        ("http://93.184.216.34/x", 400, "must be https"),
        ("http://127.0.0.1:9/x", 201, None),  # the operator allowed 127.0.0.0/8
        ("not a url", 400, "absolute http(s) URL"),
    ],
)
def test_urls_are_checked_before_they_are_stored(
    settings: Settings, url: str, status: int, detail: str | None
) -> None:
    (answer,) = send(settings, post("alice", "/v1/webhooks", {"url": url}))
    assert answer.status_code == status, answer.text
    if detail is not None:
        assert detail in answer.json()["detail"]


def test_bad_bodies_and_the_tenants_limit(settings: Settings) -> None:
    unknown, twice, empty, first, second, third = send(
        settings,
        post("alice", "/v1/webhooks", {"url": PUBLIC, "events": ["job.exploded"]}),
        post("alice", "/v1/webhooks", {"url": PUBLIC, "events": ["job.failed", "job.failed"]}),
        post("alice", "/v1/webhooks", {"url": PUBLIC, "events": []}),
        post("alice", "/v1/webhooks", {"url": PUBLIC}),
        post("alice", "/v1/webhooks", {"url": PUBLIC}),
        post("alice", "/v1/webhooks", {"url": PUBLIC}),
    )
    assert [unknown.status_code, twice.status_code, empty.status_code] == [422, 422, 422]
    assert "events" in unknown.json()["detail"] and "twice" in twice.json()["detail"]
    assert [first.status_code, second.status_code, third.status_code] == [201, 201, 429]
    assert third.json()["detail"] == "a tenant may register 2 webhooks; delete one first"
    (bobs,) = send(settings, post("bob", "/v1/webhooks", {"url": PUBLIC}))
    assert bobs.status_code == 201  # the limit is per tenant


def test_test_deliveries_page_redeliver_and_stay_the_tenants(settings: Settings) -> None:
    (made,) = send(settings, post("alice", "/v1/webhooks", {"url": PUBLIC}))
    hook = made.json()["id"]
    sent = send(settings, *[post("alice", f"/v1/webhooks/{hook}/test") for _ in range(3)])
    assert [s.status_code for s in sent] == [202, 202, 202]
    first = sent[0].json()
    assert (first["type"], first["status"], first["attempts"], first["webhook_id"]) == (
        "webhook.test",
        "pending",
        0,
        hook,
    )
    assert first["payload"]["data"] == {"webhook": hook}
    due = datetime.fromisoformat(first["next_attempt_at"]).timestamp()
    assert abs(due - time.time()) < 5  # a test is due at once
    (page1,) = send(settings, get("alice", f"/v1/webhooks/{hook}/deliveries", limit=2))
    cursor = page1.json()["next_cursor"]
    (page2,) = send(
        settings, get("alice", f"/v1/webhooks/{hook}/deliveries", limit=2, cursor=cursor)
    )
    ids = [d["id"] for d in page1.json()["items"] + page2.json()["items"]]
    assert ids == [s.json()["id"] for s in reversed(sent)]  # newest first, each once
    assert page2.json()["next_cursor"] is None

    message = first["id"]
    redis.Redis.from_url(settings.redis_url).zadd(WEBHOOK_DUE, {message: 4e9})  # retry later
    mine, theirs, other_hook, nothing = send(
        settings,
        post("alice", f"/v1/webhooks/{hook}/deliveries/{message}/redeliver"),
        post("bob", f"/v1/webhooks/{hook}/deliveries/{message}/redeliver"),
        get("bob", f"/v1/webhooks/{hook}/deliveries"),
        post("alice", f"/v1/webhooks/{hook}/deliveries/msg_{'0' * 32}/redeliver"),
    )
    assert mine.status_code == 202
    due = mine.json()["next_attempt_at"]
    assert due is not None and due < "2100"  # brought forward to now, from 2096
    assert theirs.status_code == 404 and other_hook.status_code == 404
    assert nothing.status_code == 404
    assert nothing.json() == {"detail": f"delivery 'msg_{'0' * 32}' not found"}


def test_limits_of_the_body_to_the_character(settings: Settings) -> None:
    base = "https://93.184.216.34/"
    at_url, past_url, at_text, past_text = send(
        settings,
        post("alice", "/v1/webhooks", {"url": base + "x" * (2048 - len(base))}),
        post("alice", "/v1/webhooks", {"url": base + "x" * (2049 - len(base))}),
        post("bob", "/v1/webhooks", {"url": PUBLIC, "description": "d" * 200}),
        post("bob", "/v1/webhooks", {"url": PUBLIC, "description": "d" * 201}),
    )
    assert [at_url.status_code, past_url.status_code] == [201, 422]
    assert [at_text.status_code, past_text.status_code] == [201, 422]
    assert "url" in past_url.json()["detail"] and "description" in past_text.json()["detail"]


def test_a_host_that_does_not_resolve_in_time_is_a_400(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resolver answers only once the test lets it, after the route has: the 400 can only
    come from the route's own deadline. (A resolver that slept 1 s against a bound of 1 s measured
    1.2 and 1.9 s on a loaded machine.)"""
    release = threading.Event()

    def slow(url: str, allowed: object) -> str:
        release.wait(30)
        return url

    monkeypatch.setattr(webhook_routes, "check_url", slow)
    monkeypatch.setattr(webhook_routes, "RESOLVE_SECONDS", 0.2)
    started = time.monotonic()
    try:
        (answer,) = send(settings, post("alice", "/v1/webhooks", {"url": PUBLIC}))
    finally:
        release.set()
    assert answer.status_code == 400
    assert answer.json() == {"detail": "the URL's host did not resolve within 0.2 s"}
    assert time.monotonic() - started < 15, "the route waited for the resolver"


def test_the_schema_documents_what_each_route_answers(settings: Settings) -> None:
    paths = create_app(settings).openapi()["paths"]
    documented = {
        (method.upper(), path): sorted(operation["responses"])
        for path, operations in paths.items()
        if path.startswith("/v1/webhooks")
        for method, operation in operations.items()
    }
    common = ["401", "422", "500", "503"]
    assert documented == {
        ("POST", "/v1/webhooks"): sorted(["201", "400", "413", "429", *common]),
        ("GET", "/v1/webhooks"): sorted(["200", "401", "500", "503"]),
        ("GET", "/v1/webhooks/{webhook_id}"): sorted(["200", "404", *common]),
        ("DELETE", "/v1/webhooks/{webhook_id}"): sorted(["204", "404", *common]),
        ("GET", "/v1/webhooks/{webhook_id}/deliveries"): sorted(["200", "404", *common]),
        ("GET", "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}"): sorted(
            ["200", "404", *common]
        ),
        ("POST", "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"): sorted(
            ["202", "404", *common]
        ),
        ("POST", "/v1/webhooks/{webhook_id}/test"): sorted(["202", "404", *common]),
    }
