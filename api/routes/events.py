"""`GET /v1/jobs/{id}/events`: the job's events as server-sent events, resumable by id."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query
from sse_starlette import EventSourceResponse

from api.deps import HubDep, JobDep, SettingsDep, StoreDep
from api.events import job_events

router = APIRouter(prefix="/v1/jobs", tags=["events"])
_ID = re.compile(r"^\d{1,20}(-\d{1,20})?$")


@router.get(
    "/{job_id}/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "event stream"}},
)
async def job_event_stream(
    job: JobDep,
    store: StoreDep,
    hub: HubDep,
    settings: SettingsDep,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", description="resume right after this id")
    ] = None,
    since: Annotated[
        str | None, Query(description="same as Last-Event-ID, for clients that cannot set it")
    ] = None,
) -> EventSourceResponse:
    """Events `status`, `metrics`, `checkpoint`, `log`, then `done`, after which the stream
    ends. Each has an `id`; reconnect with `Last-Event-ID: <id>` to get exactly what followed it.
    Data shapes are listed at the end of `api/schemas.py`. Idle streams get a ping comment."""
    after = last_event_id or since
    if after is not None and not _ID.match(after):
        raise HTTPException(
            422, detail=f"Last-Event-ID: {after[:40]!r} is not an event id like 1700000000000-0"
        )

    return EventSourceResponse(
        job_events(hub, store, job.id, after),
        ping=settings.sse_ping_seconds,
        send_timeout=30,
        headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
    )
