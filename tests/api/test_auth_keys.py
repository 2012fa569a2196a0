"""API keys: only the exact key opens its tenant's jobs, and keys are compared in constant time.

The integration tests use completely wrong keys; a comparison that looked at a prefix only (or
stopped at the first differing byte) passed them all. These hold the API (`create_app`, over a
real redis-server) to the exact key: one that differs in its last byte, one with a byte more, and
a prefix are each a 401, while the real key lists the tenant's jobs.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable, Iterator

import httpx
import pytest
from fastapi import HTTPException
from fastapi.security import HTTPAuthorizationCredentials

from api.app import create_app
from api.deps import get_tenant, require_metrics_token
from pdppo.settings import Settings
from tests.support.stack import RedisServer

ALICE = "alice-key-0123456789abcdef"
ALICE_SPARE = "alice-spare-0123456789abcdef"  # a tenant may hold several keys
BOB = "bob-key-0123456789abcdefgh"
METRICS_TOKEN = "metrics-token-0123456789ab"


def near_misses(key: str) -> dict[str, str]:
    """Keys a prefix comparison (or one that stops early) would take for `key`."""
    last = "0" if key[-1] != "0" else "1"
    return {
        "last character changed": key[:-1] + last,
        "one character more": key + "x",
        "one character less": key[:-1],
        "first 8 characters": key[:8],
        "first character changed": ("Z" if key[0] != "Z" else "Y") + key[1:],
    }


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(tmp_path_factory.mktemp("auth-redis"))
    yield server.url(0)
    server.stop()


def settings_for(redis_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        api_keys=f"alice:{ALICE},alice:{ALICE_SPARE},bob:{BOB}",
        metrics_token=METRICS_TOKEN,
        _env_file=None,
    )  # type: ignore[call-arg]


def get_as(redis_url: str, requests: list[tuple[str, str | None]]) -> list[httpx.Response]:
    """GET each (path, bearer key or None) from one app, through its lifespan."""
    app = create_app(settings_for(redis_url))

    async def run() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                out = []
                for path, key in requests:
                    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
                    out.append(await client.get(path, headers=headers))
                return out

    return asyncio.run(run())


def test_only_the_exact_key_opens_the_api(redis_url: str) -> None:
    """Protects `api.deps.get_tenant` against accepting a key that merely resembles a valid one
    (a prefix, one byte off at either end, one byte more or less)."""
    misses = {**near_misses(ALICE), **{f"bob's {k}": v for k, v in near_misses(BOB).items()}}
    requests: list[tuple[str, str | None]] = [("/v1/jobs", ALICE), ("/v1/jobs", ALICE_SPARE)]
    requests += [("/v1/jobs", BOB), ("/v1/jobs", None)]
    requests += [("/v1/jobs", key) for key in misses.values()]
    alice, spare, bob, nobody, *refused = get_as(redis_url, requests)

    for response in (alice, spare, bob):
        assert response.status_code == 200, response.text
        assert response.json()["items"] == []
    tried = [("no key", ""), *misses.items()]
    for (what, key), response in zip(tried, [nobody, *refused], strict=True):
        assert response.status_code == 401, (what, key, response.text)
        assert response.json() == {"detail": "missing or invalid API key"}, what
        assert response.headers["www-authenticate"] == "Bearer", what


def test_only_the_exact_metrics_token_opens_metrics(redis_url: str) -> None:
    """Protects `api.deps.require_metrics_token` the same way: tenants' keys and near misses of
    the token are refused."""
    misses = list(near_misses(METRICS_TOKEN).values())
    requests: list[tuple[str, str | None]] = [("/metrics", METRICS_TOKEN), ("/metrics", ALICE)]
    requests += [("/metrics", key) for key in misses]
    opened, tenant, *refused = get_as(redis_url, requests)
    assert opened.status_code == 200 and "pdppo_" in opened.text
    for response in (tenant, *refused):
        assert response.status_code == 401, response.text
        assert response.json() == {"detail": "missing or invalid metrics token"}


Compare = Callable[[bytes, bytes], bool]


def test_every_key_is_compared_whole_with_compare_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Protects the constant-time comparison: each presented key is compared with every
    configured key, whole and with `hmac.compare_digest` (whose time does not depend on where
    the bytes differ), with no early exit at a match: the time an answer takes tells an
    attacker neither how much of a key was right nor which tenant's key it was."""
    seen: list[tuple[bytes, bytes]] = []
    real: Compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    settings = settings_for("redis://127.0.0.1:1/0")
    configured = sorted(k.encode() for k in settings.tenants_by_key)

    def tenant_of(key: str) -> str | int:
        seen.clear()
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=key)
        try:
            return asyncio.run(get_tenant(settings, credentials))
        except HTTPException as exc:
            return exc.status_code
        finally:
            assert sorted(b for _, b in seen) == configured, key
            assert {a for a, _ in seen} == {key.encode()}, key

    assert tenant_of(ALICE) == "alice"  # the first key configured: compared with the rest too
    assert tenant_of(BOB) == "bob"
    assert tenant_of(ALICE[:-1] + "0") == 401
    assert tenant_of(ALICE[:8]) == 401

    seen.clear()
    token = HTTPAuthorizationCredentials(scheme="Bearer", credentials=METRICS_TOKEN[:-1] + "0")
    with pytest.raises(HTTPException) as refused:
        asyncio.run(require_metrics_token(settings, token))
    assert refused.value.status_code == 401
    assert seen == [((METRICS_TOKEN[:-1] + "0").encode(), METRICS_TOKEN.encode())]
