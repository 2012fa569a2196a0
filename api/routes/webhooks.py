"""Webhooks: a tenant registers endpoints that receive its jobs' events, signed per Standard
Webhooks, sent by the webhook workers (`workers.webhooks`), never from a request.

The secret is drawn here and shown once, in the answer to the POST that made the endpoint: a
later GET never shows it (a leaked API key should not hand over the means to forge events), and
Redis keeps it encrypted (`pdppo.store.webhooks.sealing`). A
URL is checked before it is stored (`pdppo.webhooks.check_url`: https, public addresses unless
the operator allows a network), resolving its host in a thread, and again before every
delivery. Endpoint ids are drawn, and every lookup builds its key under the caller's tenant: one
tenant's id names nothing of another's (404).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response

from api.deps import SettingsDep, StoreDep, TenantDep
from api.schemas import ErrorBody
from api.webhook_schemas import (
    DeliveryAttempt,
    Webhook,
    WebhookCreate,
    WebhookCreated,
    WebhookDelivery,
    WebhookDeliveryList,
    WebhookList,
)
from pdppo.store.webhooks.endpoints import AsyncWebhookStore, Delivery, Endpoint
from pdppo.webhooks import URLRefused, check_url, parse_networks

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
WEBHOOK_ID = r"^wh_[0-9a-f]{24}$"
DELIVERY_ID = r"^msg_[0-9a-f]{32}$"
CURSOR = r"^[0-9]{1,15}(\.[0-9]{1,6})?$"
RESOLVE_SECONDS = 5.0
"""The longest a registration waits on DNS (a request must not hang on a slow resolver)."""


async def get_webhook_store(store: StoreDep) -> AsyncWebhookStore:
    return store.webhooks


WebhookStoreDep = Annotated[AsyncWebhookStore, Depends(get_webhook_store)]


async def get_owned_webhook(
    webhook_id: Annotated[str, Path(description="the endpoint's id", pattern=WEBHOOK_ID)],
    tenant: TenantDep,
    webhooks: WebhookStoreDep,
) -> Endpoint:
    endpoint = await webhooks.get(tenant, webhook_id)
    if endpoint is None:
        raise HTTPException(404, detail=f"webhook {webhook_id!r} not found")
    return endpoint


WebhookDep = Annotated[Endpoint, Depends(get_owned_webhook)]
DeliveryId = Annotated[
    str, Path(description="the delivery's id (its webhook-id)", pattern=DELIVERY_ID)
]
_NO_DELIVERY: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such webhook or delivery, or another tenant's"}
}


def to_webhook(endpoint: Endpoint) -> Webhook:
    return Webhook(
        id=endpoint.id,
        url=endpoint.url,
        events=endpoint.events,
        description=endpoint.description,
        created_at=datetime.fromisoformat(endpoint.created_at),
    )


def to_delivery(delivery: Delivery) -> WebhookDelivery:
    due = delivery.next_attempt_ms
    return WebhookDelivery(
        id=delivery.id,
        webhook_id=delivery.webhook,
        type=delivery.type,
        status=delivery.status,  # type: ignore[arg-type]
        attempts=delivery.attempts,
        created_at=datetime.fromisoformat(delivery.created_at),
        next_attempt_at=datetime.fromtimestamp(due / 1000, UTC) if due is not None else None,
        delivered_at=(
            datetime.fromisoformat(delivery.delivered_at) if delivery.delivered_at else None
        ),
        last_status_code=delivery.last_status_code,
        last_error=delivery.last_error,
        history=[DeliveryAttempt.model_validate(entry) for entry in delivery.history],
        payload=json.loads(delivery.payload),
    )


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreated,
    responses={
        201: {"description": "the endpoint, with its secret (shown this once)"},
        400: {"model": ErrorBody, "description": "the URL is not one webhooks may reach (why)"},
        429: {"model": ErrorBody, "description": "the tenant has PDPPO_MAX_WEBHOOKS_PER_TENANT"},
    },
)
async def create_webhook(
    body: WebhookCreate, tenant: TenantDep, webhooks: WebhookStoreDep, settings: SettingsDep
) -> WebhookCreated:
    """Register an endpoint; it receives the events of this tenant's jobs from now on."""
    networks = parse_networks(settings.webhook_allowed_networks)
    try:
        with anyio.fail_after(RESOLVE_SECONDS):
            await anyio.to_thread.run_sync(check_url, body.url, networks, abandon_on_cancel=True)
    except URLRefused as exc:
        raise HTTPException(400, detail=str(exc)) from None
    except TimeoutError:
        raise HTTPException(
            400, detail=f"the URL's host did not resolve within {RESOLVE_SECONDS:g} s"
        ) from None
    most = settings.max_webhooks_per_tenant
    # Redis keeps the secret sealed (`pdppo.store.webhooks.sealing`); development's key is a file
    box = await anyio.to_thread.run_sync(settings.webhook_secrets)
    made = await webhooks.create(
        tenant, body.url, list(body.events), body.description, most, box=box
    )
    if made is None:
        raise HTTPException(429, detail=f"a tenant may register {most} webhooks; delete one first")
    endpoint, secret = made
    return WebhookCreated(**to_webhook(endpoint).model_dump(), secret=secret)


@router.get("", response_model=WebhookList)
async def list_webhooks(tenant: TenantDep, webhooks: WebhookStoreDep) -> WebhookList:
    """The caller's endpoints, oldest first (without their secrets)."""
    return WebhookList(items=[to_webhook(e) for e in await webhooks.all(tenant)])


@router.get("/{webhook_id}", response_model=Webhook)
async def get_webhook(endpoint: WebhookDep) -> Webhook:
    return to_webhook(endpoint)


@router.delete(
    "/{webhook_id}",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "gone; its pending deliveries are dropped"}},
)
async def delete_webhook(
    endpoint: WebhookDep, tenant: TenantDep, webhooks: WebhookStoreDep
) -> Response:
    if not await webhooks.delete(tenant, endpoint.id):
        raise HTTPException(404, detail=f"webhook {endpoint.id!r} not found")
    return Response(status_code=204)


@router.get("/{webhook_id}/deliveries", response_model=WebhookDeliveryList)
async def list_deliveries(
    endpoint: WebhookDep,
    tenant: TenantDep,
    webhooks: WebhookStoreDep,
    limit: Annotated[int, Query(ge=1, le=100, description="page size")] = 20,
    cursor: Annotated[
        str | None, Query(pattern=CURSOR, description="next_cursor of the last page")
    ] = None,
) -> WebhookDeliveryList:
    """The endpoint's deliveries, newest first (its last 1000)."""
    before = float(cursor) if cursor is not None else None
    items, next_at = await webhooks.deliveries(tenant, endpoint.id, limit, before)
    return WebhookDeliveryList(
        items=[to_delivery(d) for d in items],
        next_cursor=f"{next_at:.0f}" if next_at is not None else None,
    )


@router.get(
    "/{webhook_id}/deliveries/{delivery_id}", response_model=WebhookDelivery, responses=_NO_DELIVERY
)
async def get_delivery(
    endpoint: WebhookDep, delivery_id: DeliveryId, tenant: TenantDep, webhooks: WebhookStoreDep
) -> WebhookDelivery:
    delivery = await webhooks.delivery(tenant, endpoint.id, delivery_id)
    if delivery is None:
        raise HTTPException(404, detail=f"delivery {delivery_id!r} not found")
    return to_delivery(delivery)


@router.post(
    "/{webhook_id}/deliveries/{delivery_id}/redeliver",
    status_code=202,
    response_model=WebhookDelivery,
    responses={
        202: {"description": "pending again, due now, with a fresh round of retries"},
        **_NO_DELIVERY,
    },
)
async def redeliver(
    endpoint: WebhookDep, delivery_id: DeliveryId, tenant: TenantDep, webhooks: WebhookStoreDep
) -> WebhookDelivery:
    """Send a delivery again (the same `webhook-id`: a receiver that has it ignores it)."""
    delivery = await webhooks.redeliver(tenant, endpoint.id, delivery_id)
    if delivery is None:
        raise HTTPException(404, detail=f"delivery {delivery_id!r} not found")
    return to_delivery(delivery)


@router.post(
    "/{webhook_id}/test",
    status_code=202,
    response_model=WebhookDelivery,
    responses={202: {"description": "a `webhook.test` delivery, due now"}},
)
async def send_test(
    endpoint: WebhookDep, tenant: TenantDep, webhooks: WebhookStoreDep
) -> WebhookDelivery:
    """Send a `webhook.test` event now, to check the receiver and its signature check."""
    delivery = await webhooks.send_test(tenant, endpoint)
    if delivery is None:  # deleted in between
        raise HTTPException(404, detail=f"webhook {endpoint.id!r} not found")
    return to_delivery(delivery)
