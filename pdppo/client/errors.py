"""The errors the client raises for an answer it got: an HTTP error (`ApiError`), told in one line.

Apart from `pdppo.client` so that the modules the client is built from (`pdppo.client.retry`) raise
them without importing the client (which imports them).
"""

from __future__ import annotations

from typing import Any

import httpx


class ApiError(Exception):
    """The server answered, and the answer was an error (4xx/5xx).

    `may_exist`: the jobs or files a write answered with this error may still have created or
    changed (the server's store stopped answering after it was sent); look them up."""

    def __init__(
        self,
        status_code: int,
        detail: Any,
        method: str = "",
        url: str = "",
        may_exist: list[str] | None = None,
    ) -> None:
        self.status_code = status_code
        self.detail = detail
        self.method = method
        self.url = url
        self.may_exist = may_exist or []
        where = f" ({method} {url})" if method else ""
        super().__init__(f"HTTP {status_code}{where}: {detail_text(detail)}")


def detail_text(detail: Any) -> str:
    """FastAPI validation errors arrive as a list of dicts; make them one readable line each."""
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict) and "msg" in item:
                loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                parts.append(f"{loc}: {item['msg']}" if loc else str(item["msg"]))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = response.text
    detail: Any = body
    if isinstance(body, dict):
        # `detail` is one readable line; a 422's `errors` list is the same, broken down.
        detail = body.get("detail") or body.get("errors") or body
    raise ApiError(response.status_code, detail, response.request.method, str(response.url))
