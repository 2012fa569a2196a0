"""`GET /v1/jobs/{id}/events`: the job's events as server-sent events, resumable by id."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.deps import HubDep, JobDep, SettingsDep, TenantDep
from api.http.tenant_slots import Slot
from api.schemas import ErrorBody, ServerSentEvent, ValidationErrorBody
from api.streaming.cancel import cancel_until_done
from api.streaming.events import StreamLimitReached
from api.streaming.sse_stream import job_events
from pdppo.store.jobs.events import EventId, EventIdError, parse_event_id

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["events"])
SEND_TIMEOUT_SECONDS = 30


class EventStream(StreamingResponse):
    """The event stream as a lean streaming response, holding its admission slot until it ends,
    however it ends (`done`, client gone, cut off, shutdown, HEAD).

    Not sse-starlette's EventSourceResponse: per stream it runs a task group of four tasks and
    per write an anyio cancel scope, which at a thousand streams is most of the CPU of a live
    event's fan-out and of the objects the GC walks. Here: one task pumps the frames (pings
    included, see `job_events`), one waits for the client to leave, each write has a deadline.
    """

    media_type = "text/event-stream"

    def __init__(self, slot: Slot, content: AsyncGenerator[bytes, None]) -> None:
        super().__init__(
            content,
            headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
            media_type=self.media_type,
        )
        self.slot = slot
        self.frames = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if scope["method"] == "HEAD":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            pump = asyncio.create_task(self._pump(send))
            gone = asyncio.create_task(_disconnected(receive))
            try:
                await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # its store calls can lose a cancel (`api.streaming.cancel`)
                cancel_until_done(pump)
                gone.cancel()
                await asyncio.wait({pump, gone})  # raises nothing of theirs
            if not gone.cancelled():
                gone.exception()  # a receive that failed: the client is gone either way
            if not pump.cancelled() and (error := pump.exception()) is not None:
                raise error  # a fault of ours: logged once, by the server
        finally:
            await self.frames.aclose()
            self.slot.release()

    async def _pump(self, send: Send) -> None:
        try:
            async for piece in self.frames:
                async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            # A client that has not read for SEND_TIMEOUT_SECONDS: closing its stream is the
            # point of the deadline, not a server error (no traceback).
            log.info("event stream: a client stopped reading for %ss; closed", SEND_TIMEOUT_SECONDS)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@router.get(
    "/{job_id}/events",
    response_class=EventStream,
    status_code=200,  # EventStream takes no status_code: FastAPI cannot infer it for the schema
    responses={
        200: {
            "content": {"text/event-stream": {"schema": ServerSentEvent.model_json_schema()}},
            "description": "event stream; the schema describes each event",
        },
        400: {
            "model": ErrorBody,
            "description": (
                "Last-Event-ID (or since) is not an event id, or is out of range (each part of "
                "an id is below 2^64)"
            ),
        },
        401: {"model": ErrorBody, "description": "missing or invalid API key"},
        404: {"model": ErrorBody, "description": "no such job (or another tenant's)"},
        422: {"model": ValidationErrorBody, "description": "job id longer than 64 characters"},
        429: {
            "model": ErrorBody,
            "description": (
                "too many open event streams, the tenant's (PDPPO_SSE_MAX_STREAMS_PER_TENANT) or "
                "this server's (PDPPO_SSE_MAX_STREAMS); Retry-After says when to try again"
            ),
        },
        503: {"model": ErrorBody, "description": "the job store is unreachable"},
    },
)
async def job_event_stream(
    job: JobDep,
    tenant: TenantDep,
    hub: HubDep,
    settings: SettingsDep,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", description="resume right after this id")
    ] = None,
    since: Annotated[
        str | None, Query(description="same as Last-Event-ID, for clients that cannot set it")
    ] = None,
) -> EventStream:
    """Events `status`, `metrics`, `eval`, `samples`, `checkpoint`, `log`, then `done`, after
    which the stream ends. Each has an `id`; reconnect with `Last-Event-ID: <id>` to get exactly
    what followed it. An id past the job's newest event (its events were lost, say Redis was
    restored from an older backup) gets what comes after it, and `done` when the job ends,
    whatever its id. Data shapes are listed at the end of `api/schemas.py`. Idle streams get a
    ping comment."""
    after = _event_id(last_event_id, "Last-Event-ID") or _event_id(since, "query.since")
    try:
        slot = hub.admit(tenant)
    except StreamLimitReached as exc:
        whose = f"tenant {tenant!r}" if exc.limit == "tenant" else "this server"
        raise HTTPException(
            429,
            detail=f"{whose} has {exc.value} open event streams, the most allowed; try later",
            headers={"Retry-After": str(exc.retry_after)},
        ) from None
    return EventStream(slot, job_events(hub, job, after, settings.sse_ping_seconds))


def _event_id(raw: str | None, name: str) -> EventId | None:
    """The id a client resumes after; 400 if it is not one (422 is for the schema's errors)."""
    if not raw:
        return None
    try:
        return parse_event_id(raw)
    except EventIdError as exc:
        raise HTTPException(400, detail=f"{name}: {exc}") from None
