"""Liveness, readiness (Redis reachable) and Prometheus metrics; no API key needed."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import StoreDep
from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(store: StoreDep) -> Health | JSONResponse:
    try:
        await store.redis.ping()
    except Exception as exc:
        body = Health(status="unavailable", detail=f"redis: {type(exc).__name__}")
        return JSONResponse(body.model_dump(), status_code=503)
    return Health(status="ok")


@router.get("/metrics", include_in_schema=False)
async def prometheus() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
