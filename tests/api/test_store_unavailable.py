"""With Redis down, the API answers 503 (readiness and job routes), never a bare 500."""

from __future__ import annotations

import asyncio
import socket

import httpx

from api.app import create_app
from pdppo.settings import Settings


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


def test_redis_down_is_503_not_500() -> None:
    settings = Settings(
        redis_url=f"redis://127.0.0.1:{closed_port()}/0", api_keys="acme:k", _env_file=None
    )  # type: ignore[call-arg]
    app = create_app(settings)

    async def run() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                auth = {"Authorization": "Bearer k"}
                return [
                    await client.get("/healthz"),
                    await client.get("/readyz"),
                    await client.get("/v1/jobs", headers=auth),
                    await client.get("/v1/jobs/abc", headers=auth),
                ]

    health, ready, listing, job = asyncio.run(run())
    assert health.status_code == 200
    assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
    for response in (listing, job):
        assert response.status_code == 503
        assert response.json()["detail"] == "the job store is unavailable; try again shortly"
        assert response.headers["retry-after"] == "5"
