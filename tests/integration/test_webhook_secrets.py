"""Webhook endpoints' signing secrets at rest (issue 49, point 8): Redis holds each one encrypted
with PDPPO_WEBHOOK_SECRET_KEYS, never the secret itself, and deliveries still verify with the
`standardwebhooks` library through a key rotation; a secret stored in the clear before this
still works and is encrypted when a webhook worker starts; a webhook worker without the key that
encrypted a secret fails its deliveries saying so.

The real stack: redis-server, `pdppo serve` and `pdppo webhook-worker`, restarted with each new
key list as an operator would, delivering `webhook.test` events to a local receiver. Before, the
endpoint's hash held `secret: whsec_...` as the API had drawn it: anyone who could read Redis
(a backup, a replica, `redis-cli`) could sign deliveries as the service.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cryptography.fernet import Fernet
from standardwebhooks import Webhook

from pdppo.store.keys import tenant_webhook_key
from pdppo.webhooks import new_secret
from tests.support.stack import RedisServer, Service
from tests.support.webhook_receiver import Received, Receiver

ENV = {
    "PDPPO_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
    "PDPPO_WEBHOOK_RETRY_SCHEDULE": "60",
    "PDPPO_WEBHOOK_TIMEOUT_SECONDS": "2",
    "PDPPO_WEBHOOK_RESEND_SECONDS": "10",
}
OLD, NEW, OTHER = (Fernet.generate_key().decode() for _ in range(3))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    made.start()
    yield made
    made.stop()


class Deployment:
    """The API and a webhook worker on one Redis database and artifact folder, started again
    with each key list."""

    def __init__(self, server: RedisServer, root: Path) -> None:
        self.server = server
        self.root = root
        self.svc: Service | None = None
        self.starts = 0
        self.redis = redis.Redis.from_url(server.url(0), decode_responses=True)

    def start(self, keys: str) -> Service:
        self.stop()
        self.svc = Service(self.server, self.root, env={**ENV, "PDPPO_WEBHOOK_SECRET_KEYS": keys})
        self.svc.start_api()
        self.starts += 1
        self.svc.start_webhook_worker()
        log = f"webhooks-{len(self.svc.workers) - 1}.log"
        deadline = time.monotonic() + 30
        # the worker's scheduler seals the stored secrets with the first key, then says so
        while self.svc.tail(log, 1_000_000).count(" sealed with the first key of ") < self.starts:
            assert time.monotonic() < deadline, self.svc.tail(log)
            time.sleep(0.1)
        return self.svc

    def stop(self) -> None:
        if self.svc is not None:
            self.svc.stop()
            self.svc = None

    def stored(self, webhook_id: str) -> str:
        return str(self.redis.hget(tenant_webhook_key("alice", webhook_id), "secret"))


@pytest.fixture
def deployment(own_redis: RedisServer, tmp_path: Path) -> Iterator[Deployment]:
    made = Deployment(own_redis, tmp_path / "service")
    yield made
    made.stop()


def send_test_event(svc: Service, receiver: Receiver, webhook_id: str) -> dict[str, Any]:
    """A `webhook.test` delivery to the endpoint, as it ended (delivered, or its first attempt
    failed) and the request the receiver got, if any."""
    with svc.client("alice") as alice:
        sent = alice.post(f"/v1/webhooks/{webhook_id}/test")
        assert sent.status_code == 202, sent.text
        delivery = sent.json()["id"]
        deadline = time.monotonic() + 30
        while True:
            now = alice.get(f"/v1/webhooks/{webhook_id}/deliveries/{delivery}").json()
            if now["attempts"] >= 1:
                return dict(now)
            assert time.monotonic() < deadline, now
            time.sleep(0.1)


def arrived(receiver: Receiver, delivery: str) -> Received:
    (got,) = [r for r in receiver.received if r.headers.get("webhook-id") == delivery]
    return got


def verified(secret: str, got: Received) -> dict[str, Any]:
    return dict(Webhook(secret).verify(got.body, got.headers))


def register(svc: Service, receiver: Receiver) -> dict[str, Any]:
    with svc.client("alice") as alice:
        made = alice.post(
            "/v1/webhooks", json={"url": f"{receiver.url}/ok", "events": ["job.succeeded"]}
        )
    assert made.status_code == 201, made.text
    return dict(made.json())


def test_secrets_are_stored_encrypted_and_deliveries_verify_through_a_rotation(
    deployment: Deployment, receiver: Receiver
) -> None:
    svc = deployment.start(OLD)
    hook = register(svc, receiver)
    secret, stored = hook["secret"], deployment.stored(hook["id"])
    assert secret.startswith("whsec_") and secret not in stored
    assert stored.startswith("fernet:")
    assert Fernet(OLD.encode()).decrypt(stored.removeprefix("fernet:").encode()).decode() == secret
    first = send_test_event(svc, receiver, hook["id"])
    assert first["status"] == "delivered", first
    assert verified(secret, arrived(receiver, first["id"]))["type"] == "webhook.test"

    # rotation: the new key first, the old one kept to read what it encrypted; the webhook
    # worker encrypts every stored secret with the new key when it starts
    svc = deployment.start(f"{NEW},{OLD}")
    resealed = deployment.stored(hook["id"])
    assert resealed != stored and secret not in resealed
    assert (
        Fernet(NEW.encode()).decrypt(resealed.removeprefix("fernet:").encode()).decode() == secret
    )
    second = send_test_event(svc, receiver, hook["id"])
    assert second["status"] == "delivered", second
    assert verified(secret, arrived(receiver, second["id"]))["type"] == "webhook.test"

    # ... then the old key is dropped
    svc = deployment.start(NEW)
    third = send_test_event(svc, receiver, hook["id"])
    assert third["status"] == "delivered", third
    verified(secret, arrived(receiver, third["id"]))

    # a deployment given none of the keys that encrypted it cannot sign: the delivery fails,
    # saying why, and is retried on the schedule (a corrected key list delivers it)
    svc = deployment.start(OTHER)
    refused = send_test_event(svc, receiver, hook["id"])
    assert (refused["status"], refused["last_status_code"]) == ("pending", None)
    assert refused["last_error"] == (
        f"webhook {hook['id']}: its signing secret cannot be decrypted with any key of "
        "PDPPO_WEBHOOK_SECRET_KEYS (it was encrypted with a key no longer listed; put that key "
        "back, after the first)"
    )
    assert [r for r in receiver.received if r.headers.get("webhook-id") == refused["id"]] == []
    assert deployment.stored(hook["id"]) == resealed  # left as it was
    assert "1 cannot be decrypted with any key" in svc.tail("webhooks-0.log", 1_000_000)


def test_a_secret_stored_in_the_clear_still_signs_and_is_encrypted_at_the_workers_start(
    deployment: Deployment, receiver: Receiver
) -> None:
    """An endpoint registered before secrets were encrypted: its hash holds the secret itself."""
    svc = deployment.start(OLD)
    hook = register(svc, receiver)
    deployment.stop()
    clear = new_secret()
    deployment.redis.hset(tenant_webhook_key("alice", hook["id"]), "secret", clear)

    svc = deployment.start(OLD)
    stored = deployment.stored(hook["id"])
    assert stored.startswith("fernet:") and clear not in stored
    done = send_test_event(svc, receiver, hook["id"])
    assert done["status"] == "delivered", done
    verified(clear, arrived(receiver, done["id"]))
    with svc.client("alice") as alice:  # the API still shows it, without its secret as ever
        shown = alice.get(f"/v1/webhooks/{hook['id']}")
    assert shown.status_code == 200 and "secret" not in shown.json()
