"""Webhooks' rules shared by the API (which registers endpoints) and the delivery worker (which
sends to them): the event types, the secrets, the Standard Webhooks signature, the payloads, the
retry schedule and which URLs a webhook may point at.

Signing follows the Standard Webhooks specification (standardwebhooks.com), as OpenAI's and
Svix's webhooks do, so that receivers verify pdppo's deliveries with the library they already use:
each delivery carries `webhook-id` (the same on every retry: the receiver's deduplication key),
`webhook-timestamp` (Unix seconds of this attempt) and `webhook-signature`, `v1,` then the
base64 HMAC-SHA256 of `"{id}.{timestamp}.{body}"` keyed with the secret's bytes. Secrets are
`whsec_` and base64 of 24 random bytes, the form the libraries take as they are.

URLs. A webhook makes the service send requests wherever a tenant says, so it must not become
a way into the operator's network (SSRF): a URL must be https and every address its host
resolves to must be global (not loopback, private, link-local, multicast, reserved or
unspecified), unless the operator lists the network in PDPPO_WEBHOOK_ALLOWED_NETWORKS, which
also allows plain http there (a receiver on the operator's own network). The check runs when the
endpoint is registered (a clear 400) and again before every delivery, since DNS may change;
deliveries never follow redirects, which would skip the check.

A delivery connects to the addresses its check resolved (`checked_target`), never to a name
resolved again: the name's owner controls its DNS answers, and one that answers a public address
to the check and 127.0.0.1 or 169.254.169.254 to the connection a moment later (DNS rebinding)
would otherwise reach what the check refused. The URL's host still names the receiver in the
Host header, in TLS's SNI and in the certificate check.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

JOB_STATUSES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")
OPENAI_ENDED = ("succeeded", "failed", "cancelled")
EVENT_TYPES: tuple[str, ...] = (
    *(f"job.{status}" for status in JOB_STATUSES),
    "job.checkpoint",
    *(f"fine_tuning.job.{status}" for status in OPENAI_ENDED),
)
"""What an endpoint may subscribe to: pdppo's job events (every status change, each checkpoint)
and OpenAI's three fine-tuning events, with OpenAI's payload, for receivers written for it."""
DEFAULT_EVENTS: tuple[str, ...] = ("job.succeeded", "job.failed", "job.cancelled")
TEST_EVENT = "webhook.test"
"""A delivery sent by `POST /v1/webhooks/{id}/test`, whatever the endpoint subscribed to."""

DEFAULT_SCHEDULE: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)
"""Seconds to wait before each retry after a failed attempt: 8 attempts over 27.6 hours (the
schedule Standard Webhooks' reference implementation uses), so a receiver down for a day still
gets the event."""

SIGNATURE_VERSION = "v1"


class URLRefused(ValueError):
    """A webhook URL the service will not send to; the message says why, for the 400."""


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_"))


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value for one attempt."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_secret_bytes(secret), signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def delivery_id(entry_id: str, endpoint_id: str, event_type: str) -> str:
    """The `webhook-id` of one event to one endpoint: derived, not drawn, so that routing an
    event twice (a router died before acknowledging it) finds the delivery it made already."""
    digest = hashlib.sha256(f"{entry_id}|{endpoint_id}|{event_type}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


def event_types_of(kind: str, status: str | None) -> list[str]:
    """The webhook event types one job event (`status` or `checkpoint`) is delivered as."""
    if kind == "checkpoint":
        return ["job.checkpoint"]
    if kind != "status" or status not in JOB_STATUSES:
        return []
    types = [f"job.{status}"]
    if status in OPENAI_ENDED:
        types.append(f"fine_tuning.job.{status}")
    return types


def payload(event_type: str, message_id: str, at_ms: int, job: Mapping[str, object]) -> str:
    """The body of one delivery. OpenAI's events keep OpenAI's shape (`object: event`, the job
    as `ftjob-<id>`); pdppo's follow Standard Webhooks' `{type, timestamp, data}`."""
    if event_type.startswith("fine_tuning."):
        body: dict[str, object] = {
            "id": message_id.replace("msg_", "evt_", 1),
            "object": "event",
            "created_at": at_ms // 1000,
            "type": event_type,
            "data": {"id": f"ftjob-{job['id']}"},
        }
    else:
        data = {key: value for key, value in job.items() if value not in (None, "")}
        body = {"type": event_type, "timestamp": _iso(at_ms), "data": data}
    return json.dumps(body, separators=(",", ":"))


def _iso(at_ms: int) -> str:
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(at_ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_schedule(raw: str) -> tuple[float, ...]:
    """`5,300,1800`: seconds before each retry, each > 0; empty: no retries."""
    delays = tuple(float(part) for part in raw.split(",") if part.strip())
    if any(delay <= 0 for delay in delays):
        raise ValueError(f"retry delays must be > 0 seconds: {raw!r}")
    return delays


def parse_networks(raw: str) -> list[IPNetwork]:
    """`10.0.0.0/8,127.0.0.1/32`: networks webhooks may reach besides the public internet."""
    try:
        return [ipaddress.ip_network(part.strip()) for part in raw.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(f"not a network list ({exc}): {raw!r}") from None


Resolver = Callable[[str, int], Sequence[str]]


def resolve(host: str, port: int) -> list[str]:
    """The host's addresses in getaddrinfo's order (its preference: RFC 6724), each once."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Target:
    """Where a delivery goes: the URL as registered, its host and port, and the addresses the
    host resolved to when the policy checked them, the only ones a delivery may connect to."""

    url: str
    host: str
    port: int
    addresses: tuple[str, ...]


def check_url(url: str, allowed: Iterable[IPNetwork], resolver: Resolver = resolve) -> str:
    """`url` if the service may send to it; URLRefused with the reason otherwise. Resolves the
    host (blocking: the API calls it in a thread)."""
    return checked_target(url, allowed, resolver).url


def checked_target(url: str, allowed: Iterable[IPNetwork], resolver: Resolver = resolve) -> Target:
    """The `Target` of `url`, its host resolved once and every address checked; URLRefused with
    the reason when the policy refuses any of them."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise URLRefused("a webhook URL must be an absolute http(s) URL with a host")
    if parts.username or parts.password:
        raise URLRefused("a webhook URL must not carry credentials: sign-in is by signature")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise URLRefused("the webhook URL's port is not a number from 0 to 65535") from None
    try:
        addresses = [ipaddress.ip_address(a.split("%")[0]) for a in resolver(parts.hostname, port)]
    except (OSError, UnicodeError) as exc:
        raise URLRefused(f"cannot resolve {parts.hostname!r}: {exc}") from None
    if not addresses:
        raise URLRefused(f"{parts.hostname!r} resolves to no address")
    networks = list(allowed)
    for address in addresses:
        listed = any(address in network for network in networks)
        if not listed and not address.is_global:
            raise URLRefused(
                f"{parts.hostname!r} resolves to {address}, which is not a public address; an "
                "operator may allow its network with PDPPO_WEBHOOK_ALLOWED_NETWORKS"
            )
        if not listed and parts.scheme != "https":
            raise URLRefused("a webhook URL must be https (plain http only to allowed networks)")
    return Target(url, parts.hostname, port, tuple(str(address) for address in addresses))
