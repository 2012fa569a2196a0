"""The FastAPI gateway: `create_app()` wires settings, Redis, the SSE hub and the routes.

`pdppo serve` runs it under uvicorn (`api.app:create_app`, factory). Error bodies are always
`{"detail": str}`; validation errors also carry `errors` (FastAPI's list) and their `detail`
names every offending field, so a client's mistake is a 4xx that says what to fix, never a 500.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aredis
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from api.events import EventHub
from api.limits import BodySizeLimit
from api.observability import PrometheusMiddleware
from api.routes import artifacts, events, health, jobs
from pdppo import __version__
from pdppo.settings import Settings, get_settings
from pdppo.store import AsyncJobStore

log = logging.getLogger(__name__)
REDIS_MAX_CONNECTIONS = 1024


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where, rest = parts[0], parts[1:]
        return ".".join(rest) if where == "body" and rest else ".".join([where, *rest])
    return ".".join(parts)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in exc.errors()
    ]
    detail = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in errors)
    return JSONResponse({"detail": detail, "errors": jsonable_encoder(errors)}, status_code=422)


async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis error on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        {"detail": "the job store is unavailable; try again shortly"},
        status_code=503,
        headers={"Retry-After": "5"},
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse({"detail": "internal error"}, status_code=500)


async def _warn_if_evicting(client: aredis.Redis) -> None:
    """Jobs live in Redis: a server that evicts keys under memory pressure loses them."""
    try:
        policy = (await client.config_get("maxmemory-policy")).get("maxmemory-policy")
    except aredis.RedisError:
        return  # unreachable (readyz says so) or CONFIG disabled (managed Redis)
    if policy and policy != "noeviction":
        log.warning("Redis maxmemory-policy is %r; set noeviction or jobs may be lost", policy)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = aredis.BlockingConnectionPool.from_url(
            settings.redis_url,
            decode_responses=True,
            max_connections=REDIS_MAX_CONNECTIONS,
            timeout=10,
        )
        client = aredis.Redis(connection_pool=pool)
        store = AsyncJobStore(client)
        app.state.store = store
        app.state.hub = EventHub(client, store, settings.sse_queue_size)
        await _warn_if_evicting(client)
        try:
            yield
        finally:
            await app.state.hub.close()
            await client.aclose()
            await pool.aclose()

    app = FastAPI(
        title="pdppo",
        version=__version__,
        description="RL fine-tuning jobs: submit, watch over SSE, download checkpoints.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(RedisError, _store_unavailable)
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(PrometheusMiddleware)
    for module in (jobs, events, artifacts, health):
        app.include_router(module.router)
    return app
