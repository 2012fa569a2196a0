"""Liveness, readiness (Redis reachable; a low disk is reported, not unready: `api.storage.disk`)
and Prometheus metrics; no API key needed.

`/metrics` takes the operators' `PDPPO_METRICS_TOKEN` when one is set; it stays out of the
OpenAPI schema, which documents what tenants call.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import SettingsDep, StoreDep, require_metrics_token
from api.http import service_metrics
from api.schemas import Health
from api.storage.disk import disk_detail, disk_metrics
from pdppo.store import AsyncJobStore

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(store: StoreDep, settings: SettingsDep) -> Health | JSONResponse:
    try:
        await _ping(store, settings.readyz_timeout_seconds)
    except Exception as exc:
        body = Health(status="unavailable", detail=f"redis: {type(exc).__name__}")
        return JSONResponse(body.model_dump(), status_code=503)
    return Health(status="ok", detail=await anyio.to_thread.run_sync(disk_detail, settings))


async def _ping(store: AsyncJobStore, timeout: float) -> None:
    """PING within `timeout` (PDPPO_READYZ_TIMEOUT_SECONDS), not the store's socket timeout: a
    probe gives up after a second or a few, and one that times out learns nothing, while a
    stalled Redis answers nothing for as long as the stall lasts. A ping cut off here drops its
    connection (redis-py disconnects a command cancelled mid-read), so no late reply is read as
    another command's."""
    with anyio.fail_after(timeout):
        await store.redis.ping()


@router.get("/metrics", include_in_schema=False, dependencies=[Depends(require_metrics_token)])
async def prometheus(store: StoreDep, settings: SettingsDep) -> Response:
    disk = await anyio.to_thread.run_sync(disk_metrics, settings)
    body = generate_latest() + await service_metrics.render(store, settings) + disk
    return Response(body, media_type=CONTENT_TYPE_LATEST)
