"""The webhook worker (`pdppo webhook-worker`): routes job events into deliveries and sends them,
signed, as Celery tasks on a queue of their own.

Why a worker of its own: a training worker runs one job at a time for hours, and a receiver that
never answers would hold whatever sends to it; so deliveries run here, in a pool of threads
(`PDPPO_WEBHOOK_CONCURRENCY`), each attempt bounded by `PDPPO_WEBHOOK_TIMEOUT_SECONDS`, and
nothing of it touches the API's request path or the training workers. Its Celery app is its own
(`webhook_app`, queue `webhooks`), so it never imports the trainer or starts the training
workers' fork server, reaper or retention.

Each worker also runs a scheduler thread (`Scheduler`): it routes the feed's new events
(`pdppo.store.webhooks.deliveries`) and sends a task for each delivery that is due. The due set,
not Celery, holds the retry schedule: a retry hours away is a score in Redis, not a message a
broker keeps in flight past its visibility timeout, and a task lost with its worker is sent again
when its hold runs out.

Health. Celery's ping is answered by the consumer, which lives on while the scheduler thread is
dead or stuck, and then nothing is routed or sent: the scheduler writes a heartbeat file
(`workers.upkeep.heartbeat`) after each pass that reached Redis, and the container's healthcheck
(`scheduler_healthy`, then the ping) fails when that file is older than
PDPPO_WORKER_HEALTH_MAX_AGE_SECONDS.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from typing import Any

import httpx
import redis
from celery.signals import worker_ready, worker_shutting_down

from pdppo.settings import Settings, get_settings
from pdppo.store.retry import StoreConfig, store_client
from pdppo.store.webhooks.deliveries import Attempt, WebhookDeliveries
from pdppo.store.webhooks.sealing import WebhookSecretError, reseal_all
from pdppo.webhooks import (
    Resolver,
    Target,
    URLRefused,
    checked_target,
    parse_networks,
    parse_schedule,
    resolve,
    sign,
)
from workers.celery_app import side_app
from workers.upkeep.heartbeat import Heartbeat, node_beat

log = logging.getLogger(__name__)

QUEUE = "webhooks"
DELIVER_TASK = "pdppo.webhooks.deliver"
ERROR_TEXT_KEPT = 300


webhook_app = side_app("pdppo-webhooks", QUEUE)
_deliveries: WebhookDeliveries | None = None
_lock = threading.Lock()


def deliveries() -> WebhookDeliveries:
    global _deliveries
    with _lock:
        if _deliveries is None:
            settings = get_settings()
            client = store_client(settings.redis_url, StoreConfig.from_settings(settings))
            _deliveries = WebhookDeliveries(client)
        return _deliveries


def hold_seconds(settings: Settings) -> float:
    """How long a sent delivery is held before it is sent again: its task may wait in the queue
    that long (a copy sent after it finds a newer token and does nothing), and an attempt whose
    worker died is retried that long after."""
    return settings.webhook_resend_seconds


@webhook_app.task(name=DELIVER_TASK)
def deliver(delivery_id: str, token: str) -> str:
    settings = get_settings()
    store = deliveries()
    attempt = store.begin(delivery_id, token, hold_seconds(settings))
    if attempt is None:
        return "skipped"
    outcome = attempt_delivery(store, attempt, settings)
    log.info("webhook %s (%s): %s", delivery_id, attempt.type, outcome)
    return outcome


class PinnedTransport(httpx.BaseTransport):
    """Connects to the addresses `target` was checked at, in order until one accepts (as
    `socket.create_connection` would with a name), never to the name resolved again: what the
    policy checked is what is reached. The request keeps its URL's host in the Host header, and
    over https in SNI and the certificate check (httpcore's `sni_hostname` extension: it becomes
    the TLS `server_hostname`, which both sends the name and verifies the certificate for it)."""

    def __init__(self, target: Target, verify: ssl.SSLContext | bool = True) -> None:
        self.target = target
        self.origin = httpx.URL(target.url)
        self.inner = httpx.HTTPTransport(verify=verify, trust_env=False)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if (url.scheme, url.host, url.port) != (
            self.origin.scheme,
            self.origin.host,
            self.origin.port,
        ):
            # deliveries follow no redirects, so only a bug gets here: refuse, never resolve
            raise httpx.ConnectError(f"not the checked URL's origin: {url}", request=request)
        extensions = dict(request.extensions)
        if url.scheme == "https":
            extensions["sni_hostname"] = url.host
        failed: httpx.ConnectError | None = None
        for address in self.target.addresses:
            pinned = httpx.Request(
                request.method,
                url.copy_with(host=address),
                headers=request.headers,  # its Host: the URL's host and port, as sent unpinned
                stream=request.stream,
                extensions=extensions,
            )
            try:
                return self.inner.handle_request(pinned)
            except httpx.ConnectError as exc:  # nothing was sent: the next address may answer
                failed = exc
        assert failed is not None  # a Target has at least one address
        raise failed

    def close(self) -> None:
        self.inner.close()


def attempt_delivery(
    store: WebhookDeliveries,
    attempt: Attempt,
    settings: Settings,
    *,
    resolver: Resolver = resolve,
    verify: ssl.SSLContext | bool = True,
) -> str:
    """POST the delivery once and record how it went: delivered (2xx), retry (anything else,
    while the schedule has retries left), failed (after the last) or dropped (no endpoint).
    `resolver` answers the policy's check once, and the request goes to the addresses it checked
    (`PinnedTransport`); `verify` is the certificate check (tests pass a context that trusts
    their own authority)."""
    if attempt.endpoint is None:
        store.record(attempt, "dropped")
        return "dropped"
    started = time.monotonic()
    status_code: int | None = None
    error = ""
    try:
        networks = parse_networks(settings.webhook_allowed_networks)
        target = checked_target(attempt.endpoint.url, networks, resolver)
        secret = settings.webhook_secrets().open(
            attempt.endpoint.stored_secret, f"webhook {attempt.endpoint.id}"
        )
        timestamp = int(time.time())
        body = attempt.payload.encode()
        headers = {
            "content-type": "application/json",
            "user-agent": "pdppo-webhooks",
            "webhook-id": attempt.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(secret, attempt.id, timestamp, body),
        }
        transport = PinnedTransport(target, verify)
        with httpx.Client(
            timeout=settings.webhook_timeout_seconds, trust_env=False, transport=transport
        ) as client:
            response = client.post(target.url, content=body, headers=headers)
        status_code = response.status_code
        if not 200 <= status_code < 300:
            error = f"HTTP {status_code}: {response.text[:ERROR_TEXT_KEPT]}"
    except URLRefused as exc:
        error = f"refused: {exc}"
    except WebhookSecretError as exc:  # nothing sent: the operator's keys lack the one it needs
        log.error("webhook delivery %s: %s", attempt.id, exc)
        error = str(exc)
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_KEPT] or type(exc).__name__
    duration_ms = (time.monotonic() - started) * 1000
    if not error:
        store.record(attempt, "delivered", status_code=status_code, duration_ms=duration_ms)
        return "delivered"
    schedule = parse_schedule(settings.webhook_retry_schedule)
    if attempt.tries < len(schedule):
        retry_at = time.time() + schedule[attempt.tries]
        store.record(
            attempt,
            "retry",
            retry_at=retry_at,
            status_code=status_code,
            error=error,
            duration_ms=duration_ms,
        )
        return "retry"
    store.record(attempt, "failed", status_code=status_code, error=error, duration_ms=duration_ms)
    return "failed"


class Scheduler(threading.Thread):
    """Routes new events and sends the due deliveries' tasks, until stopped."""

    redis_pause = 1.0  # seconds before the next pass after Redis failed one
    bug_pause = 5.0  # after anything else (a bug: it is logged with its traceback)

    def __init__(
        self,
        store: WebhookDeliveries,
        settings: Settings,
        consumer: str,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        super().__init__(name="webhook-scheduler", daemon=True)
        self.store = store
        self.settings = settings
        self.consumer = consumer
        self.heartbeat = heartbeat  # beaten after each pass that reached Redis
        self.stopping = threading.Event()
        self.resealed = False  # stored secrets sealed with the first key, once per start

    def block_ms(self) -> int:
        """How long a pass waits for new events: half a second, or less when the client gives
        up on a reply sooner (PDPPO_REDIS_SOCKET_TIMEOUT_SECONDS), or every wait would fail."""
        timeout = self.store.redis.connection_pool.connection_kwargs.get("socket_timeout")
        return 500 if not timeout else max(1, min(500, int(timeout * 1000) // 2))

    def run(self) -> None:
        log.info("webhook scheduler: started (%s)", self.consumer)
        while not self.stopping.is_set():
            try:
                if not self.resealed:
                    self.reseal()
                self.pass_once(block_ms=self.block_ms())
                self.beat()
            except redis.RedisError as exc:
                log.warning("webhook scheduler: %s; trying again in %g s", exc, self.redis_pause)
                self.stopping.wait(self.redis_pause)
            except Exception:  # a bug: say so, and go on (a dead scheduler delivers nothing)
                log.exception("webhook scheduler: unexpected error; again in %g s", self.bug_pause)
                self.stopping.wait(self.bug_pause)
        log.info("webhook scheduler: stopped")

    def reseal(self) -> None:
        """Seal every stored secret with the first key of PDPPO_WEBHOOK_SECRET_KEYS: the step
        that completes a key rotation, and the migration of secrets stored in the clear
        (`pdppo.store.webhooks.sealing`). Says what it did, so an operator knows when the old
        key may go."""
        sealed, unreadable = reseal_all(self.store.redis, self.settings.webhook_secrets())
        self.resealed = True
        log.info(
            "webhook secrets: %d sealed with the first key of PDPPO_WEBHOOK_SECRET_KEYS; every "
            "stored secret is now sealed with it%s",
            sealed,
            "" if not unreadable else " but those that no key decrypts",
        )
        if unreadable:
            log.error(
                "webhook secrets: %d cannot be decrypted with any key of "
                "PDPPO_WEBHOOK_SECRET_KEYS (encrypted with a key no longer listed), so their "
                "deliveries fail: %s",
                len(unreadable),
                ", ".join(unreadable[:20]),
            )

    def beat(self) -> None:
        """Say this pass reached Redis. A heartbeat folder that cannot be written fails the
        healthcheck, and must not also slow the deliveries (a bug's pause after every pass)."""
        if self.heartbeat is None:
            return
        try:
            self.heartbeat.beat()
        except OSError as exc:
            log.warning("webhook scheduler: cannot write its heartbeat: %s", exc)

    def pass_once(self, block_ms: int | None = None) -> int:
        """One round: route, then send what is due; returns the tasks sent."""
        self.store.ensure_group()
        self.store.route(self.consumer, block_ms=block_ms)
        due = self.store.take_due(hold_seconds(self.settings))
        for delivery_id, token in due:
            webhook_app.send_task(DELIVER_TASK, args=[delivery_id, token], queue=QUEUE)
        return len(due)


_scheduler: Scheduler | None = None


@worker_ready.connect
def _start_scheduler(sender: Any = None, **_: Any) -> None:
    global _scheduler
    if sender is None or getattr(sender, "app", None) is not webhook_app:
        return
    consumer = f"{socket.gethostname()}:{os.getpid()}"
    settings = get_settings()
    # no Redis client: the API's /metrics counts training workers' beats, not this one's
    heartbeat = Heartbeat(settings.worker_heartbeat_dir, str(sender.hostname))
    _scheduler = Scheduler(deliveries(), settings, consumer, heartbeat)
    _scheduler.start()


@worker_shutting_down.connect
def _stop_scheduler(**_: Any) -> None:
    if _scheduler is not None:
        _scheduler.stopping.set()


def scheduler_healthy(node: str) -> bool:
    """Whether the scheduler of the webhook worker named `node` (its Celery node name) passed
    within PDPPO_WORKER_HEALTH_MAX_AGE_SECONDS: the half of the container's healthcheck that
    Celery's ping cannot see. Prints why, for `docker inspect`."""
    settings = get_settings()
    limit = settings.worker_health_max_age_seconds
    beat = node_beat(settings.worker_heartbeat_dir, node)
    if beat is None:
        print(f"{node}: no webhook scheduler of a running process has reached Redis yet")
        return False
    if beat.age > limit:
        print(f"{node}: webhook scheduler last reached Redis {beat.age:.0f}s ago (> {limit:g}s)")
        return False
    print(f"{node}: webhook scheduler reached Redis {beat.age:.0f}s ago")
    return True
