"""The FastAPI gateway: `create_app()` wires settings, Redis, the SSE hub and the routes.

`pdppo serve` runs it under uvicorn (`api.app:create_app`, factory). Error bodies are always
`{"detail": str}` (`api.schemas.ErrorBody`), and every 422, whatever refused the request, is
`{"detail": str, "errors": [...]}` (`ValidationErrorBody`): the detail names every offending
field, so a client's mistake is a 4xx that says what to fix, never a 500.

`/openapi.json` is the contract the client, the CLI and Schemathesis (CI) hold the server to, so
it is completed here from what the server really does rather than left to each route: every
operation documents the errors its dependencies and middleware can answer (401 from the API key,
404 from a job lookup, 400/413 from a body, 422, 503 from Redis, 500), each with its model, and
FastAPI's default 422 model (`HTTPValidationError`, whose `detail` is a list) is not published,
because no response has that shape. A 405 answers with `Allow` listing every method of the path:
Starlette names only the methods of the first route it tried (`POST` for `OPTIONS /v1/jobs`).
`OPTIONS` is not served (no CORS here): it gets that 405 and its `Allow`, like any other method
the path does not have.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import fastapi.routing
import redis.asyncio as aredis
from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic.json_schema import models_json_schema
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

from api.completions import blocking_client
from api.dashboard import mount_dashboard
from api.deps import get_owned_file, get_owned_job, get_store, get_tenant
from api.docs import mount_docs
from api.http.limits import BodySizeLimit
from api.http.observability import PrometheusMiddleware
from api.jobs.pending_writes import unavailable_response
from api.jobs.publisher import TaskPublisher
from api.openai import chat as openai_chat
from api.openai import errors as openai_errors
from api.openai import routes as openai_routes
from api.openai.grading import grader_runs
from api.openai.schemas import OpenAIErrorBody
from api.openai.translate import Refused
from api.routes import (
    artifacts,
    completions,
    events,
    experiments,
    files,
    health,
    jobs,
    results,
    steering,
    storage,
    webhooks,
)
from api.schemas import ErrorBody, ValidationErrorBody
from api.storage.uploads import FORM_OVERHEAD_BYTES
from api.streaming.events import EventHub, freeze_startup_heap, redis_driver_info
from core.config.names import unknown_field
from pdppo import __version__
from pdppo.settings import Settings, get_settings
from pdppo.store import AsyncJobStore
from workers.celery_app import enqueue

log = logging.getLogger(__name__)
REDIS_MAX_CONNECTIONS = 1024


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where, rest = parts[0], parts[1:]
        return ".".join(rest) if where == "body" and rest else ".".join([where, *rest])
    return ".".join(parts)


def _message(msg: str) -> str:
    """pydantic's message for a validator's ValueError/assert without the "Value error, " (or
    "Assertion failed, ") it prepends: the validators' own messages are written for people."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg.removeprefix(prefix)
    return msg


def _body_model(request: Request) -> Any:
    """The type the route reads its body as (a JobSpec), or None."""
    body = getattr(request.scope.get("route"), "body_field", None)
    return None if body is None else body.field_info.annotation


def _hinted(request: Request, error: dict[str, Any]) -> dict[str, Any]:
    """An unknown key of the body told with the close field (`core.config.names`)."""
    loc = list(error.get("loc", ()))
    model = _body_model(request)
    if error.get("type") != "extra_forbidden" or loc[:1] != ["body"] or model is None:
        return error
    return {**error, "msg": unknown_field(model, loc[1:])}


def _line_column(body: Any, position: Any) -> str:
    """` (line L, column C)` of a character position in the body, as a JSON parser says it."""
    if not isinstance(body, str) or not isinstance(position, int):
        return ""
    line = body.count("\n", 0, position) + 1
    column = position - (body.rfind("\n", 0, position) + 1) + 1
    return f" (line {line}, column {column})"


def not_json(exc: RequestValidationError, content_type: str) -> str | None:
    """Why the body is not JSON, when that is what FastAPI's validation refused: a body that
    does not parse (YAML sent as `application/json`), or one sent as another media type (FastAPI
    validates its bytes as the model). Such a body is unreadable, a 400, not a 422 naming a
    field (`"0: JSON decode error"`, `"body: Input should be a valid dictionary"`)."""
    for error in exc.errors():
        loc = tuple(error.get("loc", ()))
        if error.get("type") == "json_invalid" and loc[:1] == ("body",):
            reason = (error.get("ctx") or {}).get("error") or "it does not parse"
            where = _line_column(exc.body, loc[1] if len(loc) > 1 else None)
            return f"the body is not JSON: {reason}{where}"
        if loc == ("body",) and isinstance(error.get("input"), bytes):
            return (
                f"the body is not JSON (Content-Type: {content_type or 'none'}); send JSON as "
                "application/json"
            )
    return None


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    unreadable = not_json(exc, request.headers.get("content-type", ""))
    if unreadable is not None:
        return JSONResponse({"detail": unreadable}, status_code=400)
    errors = [
        {
            "loc": list(e.get("loc", ())),
            "msg": _message(e.get("msg", "")),
            "type": e.get("type", ""),
        }
        for e in (_hinted(request, e) for e in exc.errors())
    ]
    detail = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in errors)
    return JSONResponse({"detail": detail, "errors": jsonable_encoder(errors)}, status_code=422)


# Every route of an app, each with its full path, dependencies and body. Recent FastAPI keeps an
# included router's routes inside it (`iter_route_contexts` flattens them, as its own OpenAPI
# generator does); older versions copied them into `app.routes`, which was then already flat.
_iter_routes: Callable[[Sequence[BaseRoute]], Iterable[Any]] = getattr(
    fastapi.routing, "iter_route_contexts", iter
)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves on this path (`GET, POST` for `/v1/jobs`), for `Allow`."""
    methods: set[str] = set()
    for route in _iter_routes(request.app.routes):
        if route.methods:
            match, _ = route.matches(request.scope)
            if match is not Match.NONE:
                methods |= set(route.methods)
    return ", ".join(sorted(methods))


async def _http_error(request: Request, exc: Exception) -> Response:
    """HTTPException, raised by routes, dependencies, FastAPI and Starlette, in the documented
    shapes: `{"detail": str}`, plus `"errors": []` on a 422 (refused after the schema, so no
    field-by-field list), and a 405's `Allow` computed from every route of the path."""
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    if exc.status_code < 200 or exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=headers)
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(jsonable_encoder(exc.detail))
    body: dict[str, Any] = {"detail": detail}
    if exc.status_code == 422:
        body["errors"] = []
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    return unavailable_response(request, exc)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return openai_errors.unexpected(request) or JSONResponse(
        {"detail": "internal error"}, status_code=500
    )


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Refused)
    return openai_errors.error_response(400, str(exc), exc.param)


async def _warn_if_evicting(client: aredis.Redis) -> None:
    """Jobs live in Redis: a server that evicts keys under memory pressure loses them."""
    try:
        policy = (await client.config_get("maxmemory-policy")).get("maxmemory-policy")
    except aredis.RedisError:
        return  # unreachable (readyz says so) or CONFIG disabled (managed Redis)
    if policy and policy != "noeviction":
        log.warning("Redis maxmemory-policy is %r; set noeviction or jobs may be lost", policy)


# What an operation can answer besides its own statuses, and why: (status, description).
_UNAUTHORIZED = (401, "missing or invalid API key (`Authorization: Bearer <key>`)")
_NOT_FOUND = (404, "no such job, or another tenant's (indistinguishable)")
_FILE_NOT_FOUND = (404, "no such file, or another tenant's (indistinguishable)")
_WEBHOOK_NOT_FOUND = (404, "no such webhook, or another tenant's (indistinguishable)")
_BAD_BODY = (
    400,
    "the body could not be read: not JSON (it does not parse, is not UTF-8, or is sent as "
    "another media type)",
)
_TOO_LARGE = (413, "request body larger than PDPPO_MAX_BODY_BYTES")
_INVALID = (
    422,
    "the request does not fit the schema (`errors` lists each field), or was refused after it "
    "(`errors` empty, `detail` says why)",
)
_UNAVAILABLE = (503, "the job store (Redis) is unreachable; retry after `Retry-After` seconds")
_INTERNAL = (500, "a bug; the server's log has the traceback")
# Statuses a route raises from its body, where no dependency shows them; a route's own
# `responses=` wins when it has one. Keyed by (method, path template).
_RAISED_BY_ROUTE: dict[tuple[str, str], list[tuple[int, str]]] = {
    ("POST", "/v1/jobs/{job_id}/cancel"): [(409, "the job has already finished")],
    ("POST", "/v1/jobs"): [(404, "the new job vanished before it could be returned (a race)")],
}


def _dependency_calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _dependency_calls(sub)


def _error_statuses(route: Any, method: str, operation: dict[str, Any]) -> list[tuple[int, str]]:
    """What `route` (an API route) can answer besides success, from what it depends on and
    takes."""
    calls = set(_dependency_calls(route.dependant)) if route.dependant is not None else set()
    out = [_INTERNAL]
    if get_tenant in calls:
        out.append(_UNAUTHORIZED)
    if get_owned_job in calls or openai_routes.get_openai_job in calls:
        out.append(_NOT_FOUND)
    if get_owned_file in calls:
        out.append(_FILE_NOT_FOUND)
    if webhooks.get_owned_webhook in calls:
        out.append(_WEBHOOK_NOT_FOUND)
    if route.body_field is not None:
        out += [_BAD_BODY, _TOO_LARGE]
    if (
        route.body_field is not None
        or operation.get("parameters")
        or "422" in operation.get("responses", {})
    ):
        out.append(_INVALID)
    if get_store in calls:
        out.append(_UNAVAILABLE)
    return out + _RAISED_BY_ROUTE.get((method, route.path_format), [])


def _without_null(parameter: dict[str, Any]) -> None:
    """`X | None` in a query or header parameter means "may be left out": on the wire it is a
    string or nothing, never JSON null. FastAPI publishes `anyOf: [X, null]`, which tells clients
    (and Schemathesis, which sends `Last-Event-ID: null`) that the text "null" is valid."""
    schema = parameter.get("schema", {})
    branches = schema.get("anyOf")
    if not isinstance(branches, list) or {"type": "null"} not in branches:
        return
    rest = [b for b in branches if b != {"type": "null"}]
    if len(rest) == 1:
        del schema["anyOf"]
        schema.update({**rest[0], **schema})
    else:
        schema["anyOf"] = rest


def _ref(model: type[Any]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def document_errors(app: FastAPI, schema: dict[str, Any]) -> None:
    """Completes `schema` (FastAPI's, in place) with every error each operation can answer.

    Every status of 400 and above gets a JSON body: `ValidationErrorBody` for 422, whatever the
    route declared (FastAPI's default and a route's own 422 model both say otherwise), and
    `ErrorBody` for the rest unless the route documents a model of its own (`/readyz`: Health).
    Errors are JSON even where the success is not (event streams, tarballs, CSV). Optional query
    and header parameters are published without their `null` (see `_without_null`). On
    `/v1/files` each error body also holds OpenAI's `error` object (`OpenAIErrorBody`)."""
    _, definitions = models_json_schema(
        [
            (ErrorBody, "serialization"),
            (ValidationErrorBody, "serialization"),
            (OpenAIErrorBody, "serialization"),
        ],
        ref_template="#/components/schemas/{model}",
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(definitions["$defs"])
    for route in _iter_routes(app.routes):
        if not isinstance(getattr(route, "original_route", route), APIRoute):
            continue
        if not route.include_in_schema:
            continue
        for method in sorted(route.methods or ()):
            operation = schema["paths"].get(route.path_format, {}).get(method.lower())
            if operation is None:
                continue
            for parameter in operation.get("parameters", []):
                if not parameter.get("required"):
                    _without_null(parameter)
            responses = operation.setdefault("responses", {})
            for status, description in _error_statuses(route, method, operation):
                response = responses.setdefault(str(status), {"description": description})
                if (status, description) == _BAD_BODY and description not in response[
                    "description"
                ]:
                    # a route's own 400 (a refused webhook URL): the body's is one more
                    response["description"] += "; or " + description
            if openai_errors.is_openai(route.path_format):
                _as_openai(responses)
                continue
            for status, response in responses.items():
                if not status.isdigit() or int(status) < 400:
                    continue
                own = response.get("content", {}).get("application/json", {}).get("schema", {})
                model: dict[str, Any]
                if status == "422":
                    model = _ref(ValidationErrorBody)
                elif own.get("$ref") and own != _ref(ValidationErrorBody):
                    model = own
                else:
                    model = _ref(ErrorBody)
                if openai_errors.is_files(route.path_format):  # both shapes: see api.openai.errors
                    model = {"allOf": [model, _ref(OpenAIErrorBody)]}
                response["content"] = {"application/json": {"schema": model}}
    text = json.dumps(schema["paths"])
    for unused in ("HTTPValidationError", "ValidationError"):
        if f'/{unused}"' not in text:
            components.pop(unused, None)


def _as_openai(responses: dict[str, Any]) -> None:
    """The errors of an OpenAI route: OpenAI's error object, and a 422 answered as a 400
    (`api.openai.errors`)."""
    invalid = responses.pop("422", None)
    if invalid is not None:
        if invalid["description"] == "Validation Error":  # FastAPI's, for a body's schema
            invalid["description"] = "the request does not fit the schema (`param` names a field)"
        bad = responses.setdefault("400", {"description": invalid["description"]})
        if bad is not invalid and invalid["description"] not in bad["description"]:
            bad["description"] += "; or " + invalid["description"]
    for status, response in responses.items():
        if status.isdigit() and int(status) >= 400:
            response["content"] = {"application/json": {"schema": _ref(OpenAIErrorBody)}}


class PdppoAPI(FastAPI):
    """FastAPI whose OpenAPI schema documents every error (see `document_errors`)."""

    _documented: dict[str, Any] | None = None

    def openapi(self) -> dict[str, Any]:
        # FastAPI caches its schema and builds a new one when the routes change: complete each
        # new one, once, in place.
        schema = super().openapi()
        if self._documented is not schema:
            document_errors(self, schema)
            self._documented = schema
        return schema


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Requests share a bounded pool and wait (up to `timeout`) for a connection rather than
        # opening one each: a storm of requests must not become a storm of Redis connections.
        # No request command blocks on the server, so a reply slower than the socket timeout
        # means a stalled Redis (a 503); the event streams' blocking reads have their own pool.
        pool = aredis.BlockingConnectionPool.from_url(
            settings.redis_url,
            decode_responses=True,
            max_connections=settings.api_redis_max_connections,
            timeout=10,
            socket_timeout=settings.redis_socket_timeout_seconds,
            socket_connect_timeout=settings.redis_connect_timeout_seconds,
            driver_info=redis_driver_info(),
        )
        client = aredis.Redis(connection_pool=pool)
        store = AsyncJobStore(client)
        app.state.store = store
        app.state.hub = EventHub.from_settings(client, store, settings)
        app.state.publisher = TaskPublisher(enqueue)
        app.state.sample_redis = blocking_client(settings)
        freeze_startup_heap()  # see its docstring: GC pauses under a storm of event streams
        await _warn_if_evicting(client)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(app.state.publisher.close)
            await app.state.hub.close()
            await app.state.sample_redis.aclose()
            await client.aclose()
            await pool.aclose()

    app = PdppoAPI(
        title="pdppo",
        version=__version__,
        description="RL fine-tuning jobs: submit, watch over SSE, download checkpoints.",
        lifespan=lifespan,
        docs_url=None,  # served by `api.docs`, from this server rather than a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.grader_runs = grader_runs(settings)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RedisError, _store_unavailable)
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_exception_handler(Refused, _refused)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        path_limits={"/v1/files": settings.max_file_bytes + FORM_OVERHEAD_BYTES},
    )
    app.add_middleware(openai_errors.OpenAIErrors)  # outside the body limit: its 413 too
    app.add_middleware(PrometheusMiddleware)
    routers = (
        jobs,
        steering,
        events,
        artifacts,
        results,
        files,
        health,
        storage,
        webhooks,
        experiments,
        completions,
        openai_routes,
        openai_chat,
    )
    for module in routers:
        app.include_router(module.router)
    mount_dashboard(app)
    mount_docs(app)
    return app
