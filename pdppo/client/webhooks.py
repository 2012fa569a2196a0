"""The client's webhook methods (`/v1/webhooks`), mixed into `pdppo.client.Client`.

Kept apart from `pdppo.client` so that each module stays about one resource. None of these calls
is retried through a store stall as the job writes are: registering an endpoint or sending a test
event twice would make a second endpoint or a second delivery, and the server has no
idempotency key for them; an error reaches the caller, who can list what exists and decide.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import httpx


class Webhook(BaseModel):
    """A registered endpoint; unknown fields are kept, not rejected."""

    model_config = ConfigDict(extra="allow")

    id: str
    url: str
    events: builtins.list[str] = Field(default_factory=builtins.list)
    description: str = ""
    created_at: datetime | None = None
    secret: str | None = None
    """`whsec_...`, only in what `create_webhook` returns: the server never shows it again."""


class DeliveryAttempt(BaseModel):
    """One attempt: when, the receiver's status (None: no answer), why it failed (None: it
    did not), how long it took."""

    model_config = ConfigDict(extra="allow")

    at: datetime
    status_code: int | None = None
    error: str | None = None
    duration_ms: float


class WebhookDelivery(BaseModel):
    """One event sent (or to be sent) to one endpoint, with its attempts so far."""

    model_config = ConfigDict(extra="allow")

    id: str
    """`msg_...`: the `webhook-id` header, the same on every retry (the receiver's dedup key)."""
    webhook_id: str
    type: str
    status: str
    """pending, delivered, failed (every retry failed) or dropped (the endpoint was deleted)."""
    attempts: int = 0
    created_at: datetime | None = None
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None
    last_status_code: int | None = None
    last_error: str | None = None
    history: builtins.list[DeliveryAttempt] = Field(default_factory=builtins.list)
    payload: dict[str, Any] = Field(default_factory=dict)


class DeliveryPage(BaseModel):
    """One page of an endpoint's deliveries, newest first; `next_cursor` gets older ones."""

    items: builtins.list[WebhookDelivery]
    next_cursor: str | None = None


class WebhooksMixin:
    """Webhook methods of `Client`: it supplies `_request`."""

    if TYPE_CHECKING:

        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

    def create_webhook(
        self, url: str, events: Sequence[str] | None = None, description: str = ""
    ) -> Webhook:
        """Registers an endpoint for this tenant's job events (`events` None: the server's
        default, the job.* ends). The answer's `secret` verifies every delivery's signature and
        is shown this once: store it now. `ApiError` 400 names why a URL is refused (not https,
        not a public address), 429 when the tenant has as many endpoints as it may."""
        body: dict[str, Any] = {"url": url, "description": description}
        if events is not None:
            body["events"] = builtins.list(events)
        return Webhook.model_validate(self._request("POST", "/v1/webhooks", json=body).json())

    def list_webhooks(self) -> builtins.list[Webhook]:
        """This tenant's endpoints, oldest first, without their secrets."""
        items = self._request("GET", "/v1/webhooks").json()["items"]
        return [Webhook.model_validate(item) for item in items]

    def get_webhook(self, webhook_id: str) -> Webhook:
        return Webhook.model_validate(self._request("GET", f"/v1/webhooks/{webhook_id}").json())

    def delete_webhook(self, webhook_id: str) -> None:
        """Deletes the endpoint; its pending deliveries are dropped, not sent."""
        self._request("DELETE", f"/v1/webhooks/{webhook_id}")

    def webhook_deliveries(
        self, webhook_id: str, limit: int = 20, cursor: str | None = None
    ) -> DeliveryPage:
        """One page of the endpoint's deliveries, newest first (the server keeps its last 1000)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        answer = self._request("GET", f"/v1/webhooks/{webhook_id}/deliveries", params=params)
        return DeliveryPage.model_validate(answer.json())

    def iter_webhook_deliveries(
        self, webhook_id: str, page_size: int = 100
    ) -> Iterator[WebhookDelivery]:
        """Every delivery the server keeps for the endpoint, newest first, walking the pages."""
        cursor: str | None = None
        while True:
            page = self.webhook_deliveries(webhook_id, limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    def get_webhook_delivery(self, webhook_id: str, delivery_id: str) -> WebhookDelivery:
        path = f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}"
        return WebhookDelivery.model_validate(self._request("GET", path).json())

    def redeliver(self, webhook_id: str, delivery_id: str) -> WebhookDelivery:
        """Sends a delivery again, due now, with a fresh round of retries; it keeps its id, so a
        receiver that already has it can ignore it."""
        path = f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"
        return WebhookDelivery.model_validate(self._request("POST", path).json())

    def test_webhook(self, webhook_id: str) -> WebhookDelivery:
        """Sends a `webhook.test` event now, whatever the endpoint subscribed to: a check of the
        receiver and of its signature check. Returns the new delivery (pending)."""
        path = f"/v1/webhooks/{webhook_id}/test"
        return WebhookDelivery.model_validate(self._request("POST", path).json())
