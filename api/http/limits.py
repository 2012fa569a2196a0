"""Refuses oversized request bodies with 413 before they are read into memory.

One limit for every body (`PDPPO_MAX_BODY_BYTES`: job specs), and larger ones for the paths named
in `path_limits` (`POST /v1/files` streams datasets to disk and also counts the file's own bytes
against `PDPPO_MAX_FILE_BYTES`)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodySizeLimit:
    """413 on a declared Content-Length over the limit, and on a chunked body once it passes it."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, path_limits: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, limit)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # FastAPI passes HTTPException from the body reader through unchanged.
                    raise HTTPException(413, detail=self._detail(limit))
            return message

        await self.app(scope, limited, send)

    def _detail(self, limit: int) -> str:
        return f"request body is larger than the limit of {limit} bytes"

    async def _refuse(self, send: Send, limit: int) -> None:
        body = json.dumps({"detail": self._detail(limit)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
