"""Errors on `/v1/fine_tuning/...` as OpenAI's error object,
`{"error": {"message", "type", "param", "code"}}`, whatever produced them.

The native API's errors come from many places (route bodies, dependencies, FastAPI's validation,
the body-size middleware, the store's 503), all as `{"detail": ...}`. Rather than teach each of
them a second shape, `OpenAIErrors` rewrites an error body on these paths as it leaves: one place,
so no producer is missed. Two statuses change on the way, as OpenAI's own API answers them: a 422
(the schema's, or admission's) becomes a 400, which the SDK raises as `BadRequestError`. Errors
a retry cannot fix carry `x-should-retry: false`, because the SDK retries 409s by default.

`/v1/files` serves both kinds of client: the SDK's `client.files.*` and pdppo's own client,
CLI and tests, which read `detail` (and a 422's `errors`). There an error keeps its status and
native body and gains OpenAI's `error` object beside `detail` (`alongside`), so each client
finds what it reads; a 429 there is the tenant's file quota and a 507 its storage quota (or a
full disk), which no retry fixes either.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "/v1/fine_tuning"
CHAT = "/v1/chat/completions"
FILES = "/v1/files"
_NOT_RETRYABLE = {400, 401, 403, 404, 405, 409, 413}
_NOT_RETRYABLE_FILES = _NOT_RETRYABLE | {422, 429, 507}
_CODES = {401: "invalid_api_key", 404: "not_found", 409: "conflict", 429: "rate_limit_exceeded"}


def is_openai(path: str) -> bool:
    return path in (PREFIX, CHAT) or path.startswith(PREFIX + "/")


def is_files(path: str) -> bool:
    """Answered in both shapes (see the module's docstring)."""
    return path == FILES or path.startswith(FILES + "/")


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


def _native(body: bytes) -> dict[str, Any]:
    try:
        native = json.loads(body)
    except ValueError:
        native = {"detail": body.decode(errors="replace")}
    return native if isinstance(native, dict) else {"detail": str(native)}


def _as_error(status: int, native: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's error object saying what the native body says; `param` from the first of a
    422's `errors`."""
    param = None
    errors = native.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        loc = [str(p) for p in errors[0].get("loc", [])]
        param = ".".join(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    return error_body(status, str(native.get("detail", "")), param or None)


def _translated(status: int, body: bytes) -> tuple[int, bytes]:
    """The native error body as OpenAI's; one that already is (a `Refused`) passes as it is."""
    native = _native(body)
    if isinstance(native.get("error"), dict):
        return status, body
    if status == 422:
        status = 400
    return status, json.dumps(_as_error(status, native)).encode()


def file_error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """`error_body` on `/v1/files`, where a 429 is the tenant's file quota, not a rate: OpenAI
    names that `insufficient_quota`."""
    body = error_body(status, message, param)
    if status == 429:
        body["error"].update(type="insufficient_quota", code="insufficient_quota")
    return body


def alongside(status: int, body: bytes) -> tuple[int, bytes]:
    """The native error body with OpenAI's `error` object added (`/v1/files`); the status as
    it was, since pdppo's clients know its statuses (a 422 stays a 422)."""
    native = _native(body)
    error = _as_error(status, native)["error"]
    shaped = file_error_body(status, error["message"], error["param"])
    return status, json.dumps({**native, **shaped}).encode()


class OpenAIErrors:
    """Rewrites error responses under PREFIX (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if is_openai(scope["path"]):
            shape, keep = _translated, _NOT_RETRYABLE
        elif is_files(scope["path"]):
            shape, keep = alongside, _NOT_RETRYABLE_FILES
        else:
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
            status, body = shape(start["status"], b"".join(chunks))
            headers = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-length", b"content-type", b"x-should-retry")
            ]
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            if status in keep:
                headers.append((b"x-should-retry", b"false"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, rewrite)


def unexpected(request: Request) -> JSONResponse | None:
    """The 500 for these paths (Starlette answers it outside every middleware)."""
    if is_files(request.url.path):
        body = {"detail": "internal error", **file_error_body(500, "internal error")}
        return JSONResponse(body, 500)
    if not is_openai(request.url.path):
        return None
    return error_response(500, "internal error")
