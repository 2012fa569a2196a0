"""Errors on `/v1/fine_tuning/...` as OpenAI's error object,
`{"error": {"message", "type", "param", "code"}}`, whatever produced them.

The native API's errors come from many places (route bodies, dependencies, FastAPI's validation,
the body-size middleware, the store's 503), all as `{"detail": ...}`. Rather than teach each of
them a second shape, `OpenAIErrors` rewrites an error body on these paths as it leaves: one place,
so no producer is missed. Two statuses change on the way, as OpenAI's own API answers them: a 422
(the schema's, or admission's) becomes a 400, which the SDK raises as `BadRequestError`. Errors
a retry cannot fix carry `x-should-retry: false`, because the SDK retries 409s by default.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "/v1/fine_tuning"
_NOT_RETRYABLE = {400, 401, 403, 404, 405, 409, 413}
_CODES = {401: "invalid_api_key", 404: "not_found", 409: "conflict", 429: "rate_limit_exceeded"}


def is_openai(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    if status >= 500:
        kind = "server_error"
    elif status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": _CODES.get(status)}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    headers = {"x-should-retry": "false"} if status in _NOT_RETRYABLE else None
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def _translated(status: int, body: bytes) -> tuple[int, bytes]:
    """The native error body as OpenAI's; one that already is (a `Refused`) passes as it is."""
    try:
        native = json.loads(body)
    except ValueError:
        native = {"detail": body.decode(errors="replace")}
    if isinstance(native, dict) and isinstance(native.get("error"), dict):
        return status, body
    detail = native.get("detail", "") if isinstance(native, dict) else str(native)
    param = None
    errors = native.get("errors") if isinstance(native, dict) else None
    if errors:
        loc = [str(p) for p in errors[0].get("loc", [])]
        param = ".".join(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    if status == 422:
        status = 400
    return status, json.dumps(error_body(status, str(detail), param or None)).encode()


class OpenAIErrors:
    """Rewrites error responses under PREFIX (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_openai(scope["path"]):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            status, body = _translated(start["status"], b"".join(chunks))
            headers = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-length", b"content-type", b"x-should-retry")
            ]
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            if status in _NOT_RETRYABLE:
                headers.append((b"x-should-retry", b"false"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, rewrite)


def unexpected(request: Request) -> JSONResponse | None:
    """The 500 for these paths (Starlette answers it outside every middleware)."""
    if not is_openai(request.url.path):
        return None
    return error_response(500, "internal error")
