"""pdppo/webhooks.py's rules: signatures that the `standardwebhooks` library (what receivers
run) accepts, and which URLs a webhook may point at, as a table."""

from __future__ import annotations

import ipaddress
import json
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from pdppo.webhooks import (
    Target,
    URLRefused,
    check_url,
    checked_target,
    delivery_id,
    event_types_of,
    new_secret,
    parse_networks,
    parse_schedule,
    payload,
    sign,
)


def test_the_signature_is_the_one_standard_webhooks_libraries_verify() -> None:
    secret = new_secret()
    body = payload("job.succeeded", "msg_1", 1_764_000_000_123, {"id": "j1", "status": "ok"})
    now = int(time.time())  # the library refuses a timestamp more than 5 minutes away
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(now)}
    headers["webhook-signature"] = sign(secret, "msg_1", now, body.encode())
    assert Webhook(secret).verify(body, headers) == {
        "type": "job.succeeded",
        "timestamp": "2025-11-24T16:00:00.123Z",
        "data": {"id": "j1", "status": "ok"},
    }
    with pytest.raises(WebhookVerificationError):  # another secret's signature is refused
        Webhook(new_secret()).verify(body, headers)
    assert secret.startswith("whsec_") and len(secret) == 6 + 32
    assert secret != new_secret()


def test_the_signature_of_a_known_secret_and_message() -> None:
    # the secret is bytes 0..23; the value is what standardwebhooks' own `sign` gives
    secret = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX"
    expected = "v1,ehZEL34p4RtokJ76Mky/c6YT0NkxG/H/gdzahhXIyv0="
    assert sign(secret, "msg_1", 1_700_000_000, b"{}") == expected
    at = datetime.fromtimestamp(1_700_000_000, UTC)
    assert Webhook(secret).sign("msg_1", at, "{}") == expected


def test_each_job_event_is_delivered_as_its_types() -> None:
    assert event_types_of("status", "succeeded") == ["job.succeeded", "fine_tuning.job.succeeded"]
    assert event_types_of("status", "cancelled") == ["job.cancelled", "fine_tuning.job.cancelled"]
    assert event_types_of("status", "running") == ["job.running"]
    assert event_types_of("status", "paused") == ["job.paused"]
    assert event_types_of("checkpoint", None) == ["job.checkpoint"]
    assert event_types_of("status", "bogus") == []
    assert event_types_of("metrics", None) == []


def test_openai_events_keep_openais_shape() -> None:
    body = json.loads(payload("fine_tuning.job.failed", "msg_ab", 1_700_000_000_999, {"id": "j"}))
    assert body == {
        "id": "evt_ab",
        "object": "event",
        "created_at": 1_700_000_000,
        "type": "fine_tuning.job.failed",
        "data": {"id": "ftjob-j"},
    }


def test_delivery_ids_derive_from_event_endpoint_and_type() -> None:
    one = delivery_id("1-0", "wh_a", "job.succeeded")
    assert one == delivery_id("1-0", "wh_a", "job.succeeded")
    others = {
        delivery_id("1-1", "wh_a", "job.succeeded"),
        delivery_id("1-0", "wh_b", "job.succeeded"),
        delivery_id("1-0", "wh_a", "fine_tuning.job.succeeded"),
    }
    assert one not in others and len(others) == 3
    assert one.startswith("msg_") and len(one) == 36


def resolver(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("Name or service not known")
        return table[host]

    return resolve


DNS = {
    "public.example": ["93.184.216.34"],
    "mixed.example": ["93.184.216.34", "10.0.0.5"],  # one private address is enough to refuse
    "local.example": ["127.0.0.1"],
    "v6.example": ["2606:2800:220:1:248:1893:25c8:1946"],
    "v6local.example": ["fe80::1%eth0"],
    "meta.example": ["169.254.169.254"],  # a cloud's metadata service
    "none.example": [],
}
ALLOWED = parse_networks("10.0.0.0/8")
CASES = [
    ("https://public.example/hook", None),
    ("https://v6.example:8443/x?y=1", None),
    ("http://public.example/hook", "must be https"),
    ("https://mixed.example/hook", "10.0.0.5, which is not a public address"),
    ("https://local.example/hook", "127.0.0.1, which is not a public address"),
    ("https://v6local.example/hook", "fe80::1, which is not a public address"),
    ("https://meta.example/", "169.254.169.254"),
    ("https://unknown.example/", "cannot resolve 'unknown.example'"),
    ("https://none.example/", "resolves to no address"),
    ("ftp://public.example/", "absolute http(s) URL"),
    ("/relative", "absolute http(s) URL"),
    ("https://user:pw@public.example/", "must not carry credentials"),
    ("https://public.example:99999/", "port is not a number"),
]


@pytest.mark.parametrize(("url", "refusal"), CASES)
def test_which_urls_a_webhook_may_reach(url: str, refusal: str | None) -> None:
    check = resolver(DNS)
    if refusal is None:
        assert check_url(url, [], check) == url
    else:
        with pytest.raises(URLRefused, match=refusal.replace("(", r"\(").replace(")", r"\)")):
            check_url(url, [], check)


def test_an_allowed_network_opens_private_addresses_and_plain_http_there_only() -> None:
    table = {**DNS, "ten.example": ["10.1.2.3"]}
    check = resolver(table)
    assert check_url("http://ten.example:8080/h", ALLOWED, check) == "http://ten.example:8080/h"
    assert check_url("https://mixed.example/", ALLOWED, check) == "https://mixed.example/"
    with pytest.raises(URLRefused, match="must be https"):  # public, not listed: https only
        check_url("http://mixed.example/", ALLOWED, check)
    with pytest.raises(URLRefused, match=r"127\.0\.0\.1"):
        check_url("https://local.example/", ALLOWED, check)
    loopback = parse_networks("127.0.0.0/8")
    assert check_url("http://127.0.0.1:9/x", loopback) == "http://127.0.0.1:9/x"  # real resolver


def test_settings_parse_networks_and_schedules_or_say_what_is_wrong() -> None:
    assert parse_networks(" 10.0.0.0/8, ::1/128 ,") == [
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    ]
    with pytest.raises(ValueError, match="not a network list"):
        parse_networks("10.0.0.0/33")
    assert parse_schedule("5, 300,") == (5.0, 300.0)
    assert parse_schedule("") == ()
    with pytest.raises(ValueError, match="must be > 0"):
        parse_schedule("5,0")


def test_a_checked_target_keeps_the_addresses_in_the_order_dns_gave_them() -> None:
    """The delivery connects to these, first to last (`workers.webhooks.PinnedTransport`): DNS's
    order is its preference (RFC 6724), which sorting would lose."""
    table = {"two.example": ["10.9.0.1", "10.1.0.1"], "link.example": ["fe80::1%eth0"]}
    allowed = parse_networks("10.0.0.0/8,fe80::/10")
    target = checked_target("http://Two.Example:8080/h?x=1", allowed, resolver(table))
    assert target == Target(
        "http://Two.Example:8080/h?x=1", "two.example", 8080, ("10.9.0.1", "10.1.0.1")
    )
    assert checked_target("https://link.example/", allowed, resolver(table)).addresses == (
        "fe80::1",
    )
