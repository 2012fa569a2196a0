"""The operator's side of webhooks (`pdppo.webhooks`, `workers.webhooks`): how many endpoints a
tenant may register, which networks they may reach, how deliveries are timed, and the keys their
signing secrets are encrypted with in Redis (`pdppo.store.webhooks.sealing`).
`pdppo.settings.Settings` inherits these fields (one settings object, read from `PDPPO_*`)."""

from __future__ import annotations

import base64
import binascii
from typing import Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from pdppo.webhooks import DEFAULT_SCHEDULE, parse_networks, parse_schedule

KEY_BYTES = 32  # a Fernet key: 32 url-safe base64-encoded bytes
MAKE_KEY = (
    'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
)


def parse_secret_keys(raw: str) -> list[bytes]:
    """The keys of PDPPO_WEBHOOK_SECRET_KEYS, first to last ('': none). A bad entry is named by
    its place in the list, never by its value: settings errors are logged. (Checked without
    `cryptography`, which only the processes that seal or open a secret import.)"""
    if not raw.strip():
        return []
    keys = []
    for place, entry in enumerate(raw.split(","), start=1):
        entry = entry.strip()
        if not entry:
            raise ValueError(f"PDPPO_WEBHOOK_SECRET_KEYS: entry {place} is empty")
        try:
            size = len(base64.urlsafe_b64decode(entry.encode()))
        except (binascii.Error, ValueError):
            size = -1
        if size != KEY_BYTES:
            raise ValueError(
                f"PDPPO_WEBHOOK_SECRET_KEYS: entry {place} is not a key (a key is 32 url-safe "
                f"base64-encoded bytes; make one with {MAKE_KEY})"
            )
        keys.append(entry.encode())
    return keys


class WebhookSettings(BaseSettings):
    max_webhooks_per_tenant: int = Field(
        default=20, ge=0, description="webhook endpoints a tenant may register (0: none)"
    )
    webhook_allowed_networks: str = Field(
        default="",
        description=(
            "comma-separated networks (CIDR) webhooks may reach besides public addresses, plain "
            "http included, e.g. 10.0.0.0/8 for receivers on the operator's own network; by "
            "default loopback, private and link-local addresses are refused"
        ),
    )
    webhook_retry_schedule: str = Field(
        default=",".join(f"{delay:g}" for delay in DEFAULT_SCHEDULE),
        description=(
            "seconds before each retry of a failed delivery (comma-separated); the default "
            "retries 7 times over 27.6 hours"
        ),
    )
    webhook_timeout_seconds: float = Field(
        default=10, gt=0, le=120, description="the longest one delivery attempt may take"
    )
    webhook_resend_seconds: float = Field(
        default=60,
        gt=0,
        le=3600,
        description=(
            "a delivery sent to a webhook worker and not settled this long after (its worker "
            "died mid-attempt, or it waited in the queue) is sent again; more than "
            "PDPPO_WEBHOOK_TIMEOUT_SECONDS"
        ),
    )
    webhook_concurrency: int = Field(
        default=8, ge=1, le=256, description="deliveries a webhook worker makes at once"
    )
    webhook_secret_keys: SecretStr = Field(
        default=SecretStr(""),
        description=(
            "comma-separated keys that encrypt webhook endpoints' signing secrets in Redis "
            f"(each 32 url-safe base64-encoded bytes: {MAKE_KEY}); the first encrypts, every one "
            "decrypts, so a key is rotated by putting a new one first and removing the old one "
            "once a webhook worker has started; required in production, generated in the "
            "artifact folder in development"
        ),
    )

    @model_validator(mode="after")
    def _resend_after_timeout(self) -> Self:
        if self.webhook_resend_seconds <= self.webhook_timeout_seconds:
            raise ValueError(
                "PDPPO_WEBHOOK_RESEND_SECONDS must be more than PDPPO_WEBHOOK_TIMEOUT_SECONDS, or "
                "every slow attempt would be sent twice"
            )
        return self

    @field_validator("webhook_secret_keys")
    @classmethod
    def _check_secret_keys(cls, value: SecretStr) -> SecretStr:
        parse_secret_keys(value.get_secret_value())
        return value

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _check_networks(cls, value: str) -> str:
        parse_networks(value)
        return value

    @field_validator("webhook_retry_schedule")
    @classmethod
    def _check_schedule(cls, value: str) -> str:
        parse_schedule(value)
        return value
