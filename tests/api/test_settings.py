"""Settings: PDPPO_* variables, API key parsing, and the refusal of insecure production setups."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.app import _field
from pdppo.settings import Settings, parse_api_keys
from pdppo.store.jobs.events import parse_event_id as parse_id


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
    assert settings.heartbeat_seconds == 3


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
    assert Settings(_env_file=None).environment == "production"  # type: ignore[call-arg]


def test_stream_ids_compare_numerically() -> None:
    assert parse_id("9-5") < parse_id("10-0") < parse_id("10-1")
    assert parse_id("7") == (7, 0)


def test_validation_locations_read_as_field_paths() -> None:
    assert _field(("body", "train", "steps")) == "train.steps"
    assert _field(("body",)) == "body"
    assert _field(("query", "limit")) == "query.limit"
    assert _field(("header", "Idempotency-Key")) == "header.Idempotency-Key"
