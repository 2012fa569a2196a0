"""Settings: PDPPO_* variables, API key parsing, and the refusal of insecure production setups."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from pydantic import ValidationError

from api.app import _field
from pdppo.settings import Settings, parse_api_keys
from pdppo.store.jobs.events import parse_event_id as parse_id
from pdppo.store.webhooks.sealing import WebhookSecretError

KEY = base64.urlsafe_b64encode(bytes(range(32))).decode()  # a key (fixed: test ids show it)


def test_api_keys_map_each_key_to_its_tenant() -> None:
    assert parse_api_keys(" alice:k1, bob:k2 ,alice:k3,") == {
        "k1": "alice",
        "k2": "bob",
        "k3": "alice",
    }
    assert parse_api_keys("") == {}
    assert parse_api_keys("t:key:with:colons") == {"key:with:colons": "t"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("alice", "must be 'tenant:key'"),
        ("alice:", "must be 'tenant:key'"),
        ("al ice:k", "must match"),
        ("alice:k,bob:k", "given to both 'alice' and 'bob'"),
    ],
)
def test_bad_api_keys_are_refused_with_a_reason(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_api_keys(raw)


def test_settings_read_pdppo_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDPPO_REDIS_URL", "redis://r:6380/2")
    monkeypatch.setenv("PDPPO_API_KEYS", "acme:s3cret")
    monkeypatch.setenv("PDPPO_ARTIFACT_DIR", "/data/artifacts")
    monkeypatch.setenv("PDPPO_MAX_ACTIVE_JOBS_PER_TENANT", "3")
    monkeypatch.setenv("PDPPO_LEASE_SECONDS", "9")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.redis_url == "redis://r:6380/2"
    assert settings.tenants_by_key == {"s3cret": "acme"}
    assert str(settings.artifact_dir) == "/data/artifacts"
    assert settings.max_active_jobs_per_tenant == 3
    assert settings.lease_seconds == 9


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDPPO_API_KEYS", "nocolon")
    with pytest.raises(ValidationError, match="api_keys"):
        Settings(_env_file=None)  # type: ignore[call-arg]


def test_production_refuses_missing_or_short_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDPPO_ENVIRONMENT", "production")
    monkeypatch.delenv("PDPPO_API_KEYS", raising=False)
    with pytest.raises(ValidationError, match="PDPPO_API_KEYS must be set"):
        Settings(_env_file=None)  # type: ignore[call-arg]
    monkeypatch.setenv("PDPPO_API_KEYS", "acme:short")
    with pytest.raises(ValidationError, match="shorter than 16"):
        Settings(_env_file=None)  # type: ignore[call-arg]
    monkeypatch.setenv("PDPPO_API_KEYS", "acme:a-long-enough-secret-key")
    with pytest.raises(ValidationError, match="PDPPO_WEBHOOK_SECRET_KEYS must be set"):
        Settings(_env_file=None)  # type: ignore[call-arg]
    monkeypatch.setenv("PDPPO_WEBHOOK_SECRET_KEYS", Fernet.generate_key().decode())
    assert Settings(_env_file=None).environment == "production"  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not-a-key", "entry 1 is not a key"),
        (f"{KEY},{KEY[:-2]}", "entry 2 is not a key"),
        (f"{KEY},,{KEY}", "entry 2 is empty"),
    ],
)
def test_webhook_secret_keys_that_are_no_keys_are_refused_without_showing_them(
    raw: str, message: str
) -> None:
    """A key is 32 url-safe base64 bytes (Fernet's); the message names the entry, never its
    value (a setting's error goes to logs)."""
    with pytest.raises(ValidationError, match=message) as info:
        Settings(webhook_secret_keys=raw, _env_file=None)  # type: ignore[call-arg]
    assert KEY not in str(info.value) and "not-a-key" not in str(info.value)


def test_the_first_webhook_key_encrypts_and_every_one_decrypts(tmp_path: Path) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    before = Settings(webhook_secret_keys=old, _env_file=None).webhook_secrets()  # type: ignore[call-arg]
    rotated = Settings(webhook_secret_keys=f"{new},{old}", _env_file=None).webhook_secrets()  # type: ignore[call-arg]
    after = Settings(webhook_secret_keys=new, _env_file=None).webhook_secrets()  # type: ignore[call-arg]
    sealed = before.seal("whsec_c2VjcmV0")
    assert sealed.startswith("fernet:") and "whsec_c2VjcmV0" not in sealed
    assert rotated.open(sealed, "webhook wh_1") == "whsec_c2VjcmV0"
    assert not rotated.current(sealed)  # the old key's: to encrypt again
    resealed = rotated.reseal(sealed)
    assert resealed is not None and rotated.current(resealed)
    assert after.open(resealed, "webhook wh_1") == "whsec_c2VjcmV0"
    assert rotated.reseal(resealed) is None  # the first key's already
    assert after.open("whsec_c2VjcmV0", "webhook wh_1") == "whsec_c2VjcmV0"  # stored in the clear
    assert after.reseal("whsec_c2VjcmV0") is not None
    with pytest.raises(WebhookSecretError) as info:
        after.open(sealed, "webhook wh_1")
    assert str(info.value) == (
        "webhook wh_1: its signing secret cannot be decrypted with any key of "
        "PDPPO_WEBHOOK_SECRET_KEYS (it was encrypted with a key no longer listed; put that key "
        "back, after the first)"
    )


def test_development_without_webhook_keys_shares_one_generated_key_per_artifact_folder(
    tmp_path: Path,
) -> None:
    """Every process of a development deployment (the API, the webhook worker) reads the same
    PDPPO_ARTIFACT_DIR: the key generated by the first is in it, and every other one reads it."""
    api = Settings(artifact_dir=tmp_path, _env_file=None).webhook_secrets()  # type: ignore[call-arg]
    worker = Settings(artifact_dir=tmp_path, _env_file=None).webhook_secrets()  # type: ignore[call-arg]
    assert worker.open(api.seal("whsec_c2VjcmV0"), "webhook wh_1") == "whsec_c2VjcmV0"
    (key_file,) = tmp_path.iterdir()
    assert key_file.name == ".webhook-secret-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    other = Settings(artifact_dir=tmp_path / "other", _env_file=None).webhook_secrets()  # type: ignore[call-arg]
    with pytest.raises(WebhookSecretError):
        other.open(api.seal("whsec_c2VjcmV0"), "webhook wh_1")


def test_stream_ids_compare_numerically() -> None:
    assert parse_id("9-5") < parse_id("10-0") < parse_id("10-1")
    assert parse_id("7") == (7, 0)


def test_validation_locations_read_as_field_paths() -> None:
    assert _field(("body", "train", "steps")) == "train.steps"
    assert _field(("body",)) == "body"
    assert _field(("query", "limit")) == "query.limit"
    assert _field(("header", "Idempotency-Key")) == "header.Idempotency-Key"
