"""The real app in this process over ASGI, with a real redis-server (the `settings` fixture of
tests/api/conftest.py): each request sent with its tenant's key. Faster than a started server,
so the mutation runs of the routes can afford it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from api.app import create_app
from api.openai.errors import file_error_body
from pdppo.settings import Settings

KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-0123456789"}


LINE = b'{"prompt": "1+1=", "answer": "2"}\n'  # 34 bytes


MAX_FILE = 34 * 300


Request = tuple[str, str, str, dict[str, Any]]


def send(settings: Settings, *requests: Request) -> list[httpx.Response]:
    """Each (tenant, method, path, httpx arguments), in order, to one app; `headers` among the
    arguments are sent beside the tenant's key."""
    app = create_app(settings)

    async def run() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                out = []
                for tenant, method, path, kwargs in requests:
                    args = {k: v for k, v in kwargs.items() if k != "headers"}
                    headers = {
                        "Authorization": f"Bearer {KEYS[tenant]}",
                        **kwargs.get("headers", {}),
                    }
                    out.append(await client.request(method, path, headers=headers, **args))
                return out

    return asyncio.run(run())


def call(settings: Settings, *requests: tuple[str, str, dict[str, Any]]) -> list[httpx.Response]:
    """Each (tenant, path, httpx arguments) as a POST (a GET when the arguments are empty)."""
    return send(settings, *((t, "POST" if kw else "GET", path, kw) for t, path, kw in requests))


def native(response: httpx.Response) -> dict[str, Any]:
    """An error body of `/v1/files` less OpenAI's `error` object, which says the same (checked
    here): what pdppo's own clients read."""
    body: dict[str, Any] = response.json()
    error = body.pop("error")
    assert error == file_error_body(response.status_code, body["detail"], error["param"])["error"]
    return body


def upload(content: bytes, filename: str = "d.jsonl", **data: str) -> dict[str, Any]:
    return {"files": {"file": (filename, content, "application/x-ndjson")}, "data": data}
