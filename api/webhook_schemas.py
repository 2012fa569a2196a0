"""The bodies of `/v1/webhooks`: endpoints (the secret only in the answer that made one) and
their deliveries."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pdppo.webhooks import DEFAULT_EVENTS, EVENT_TYPES

EventType = Literal[EVENT_TYPES]  # type: ignore[valid-type]


class WebhookCreate(BaseModel):
    """A new endpoint: where to send, and which events."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=1,
        max_length=2048,
        description=(
            "https URL that receives the events (POST, JSON, signed per Standard Webhooks); "
            "must resolve to public addresses unless the operator allows its network"
        ),
        examples=["https://192.0.2.10/pdppo-events"],
    )
    events: list[EventType] = Field(
        default=list(DEFAULT_EVENTS),
        min_length=1,
        max_length=len(EVENT_TYPES),
        description="event types to receive, each once (default: the job.* ends)",
        json_schema_extra={"uniqueItems": True},
    )
    description: str = Field(default="", max_length=200)

    @field_validator("events")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("events lists a type twice")
        return value


class Webhook(BaseModel):
    id: str = Field(description="wh_ and 24 hex")
    object: Literal["webhook"] = "webhook"
    url: str
    events: list[str]
    description: str
    created_at: datetime


class WebhookCreated(Webhook):
    secret: str = Field(
        description=(
            "whsec_...: verifies the `webhook-signature` of every delivery (Standard Webhooks); "
            "shown only in this answer, so store it now"
        )
    )


class WebhookList(BaseModel):
    items: list[Webhook]


class DeliveryAttempt(BaseModel):
    at: datetime
    status_code: int | None = Field(description="the receiver's HTTP status; null: no answer")
    error: str | None = Field(description="why the attempt failed; null: delivered")
    duration_ms: float


class WebhookDelivery(BaseModel):
    id: str = Field(description="msg_...: the `webhook-id` header, the same on every retry")
    object: Literal["webhook.delivery"] = "webhook.delivery"
    webhook_id: str
    type: str
    status: Literal["pending", "delivered", "failed", "dropped"] = Field(
        description=(
            "pending: to be attempted (again) at next_attempt_at; delivered: a 2xx; failed: "
            "every retry failed; dropped: the endpoint was deleted first"
        )
    )
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    history: list[DeliveryAttempt] = Field(description="the last attempts, oldest first")
    payload: dict[str, Any] = Field(description="the JSON body sent")


class WebhookDeliveryList(BaseModel):
    items: list[WebhookDelivery]
    next_cursor: str | None = Field(description="pass as `cursor` for older deliveries")
