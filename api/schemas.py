"""The JSON shapes of the HTTP API (responses); the request body is `pdppo.spec.JobSpec`.

These models are the contract the Python client and the CLI code against: every response of
`/v1/...` is one of them, and FastAPI publishes them in `/openapi.json`.

Errors are always `{"detail": "<message>"}`; a 422 adds `errors`, a list of
`{"loc": [...], "msg": "...", "type": "..."}` whose `detail` names each field and its problem.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
EventType = Literal["status", "metrics", "checkpoint", "log", "done"]


class Progress(BaseModel):
    step: int = Field(description="last step whose metrics were published; 0 before the first")
    total: int = Field(description="steps the job will run (the spec's train.steps)")


class JobError(BaseModel):
    code: str = Field(description="e.g. training_error, invalid_spec, worker_error")
    message: str
    traceback: str | None = Field(None, description="the last lines of the worker's traceback")


class Job(BaseModel):
    """A job as `POST /v1/jobs`, `GET /v1/jobs/{id}` and `POST /v1/jobs/{id}/cancel` return it."""

    id: str
    name: str | None = None
    status: JobStatus
    queue: Literal["cpu", "gpu"]
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = Field(None, description="first time a worker started it")
    finished_at: datetime | None = None
    spec: dict[str, Any] = Field(description="the submitted JobSpec, defaults filled in")
    progress: Progress
    metrics: dict[str, float] | None = Field(None, description="metrics of the latest step")
    error: JobError | None = None
    cancel_requested: bool = False
    attempts: int = Field(0, description="times a worker started it (resumes count)")


class JobList(BaseModel):
    """`GET /v1/jobs`: own jobs, newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[Job]
    next_cursor: str | None = None


class MetricsRow(BaseModel):
    step: int
    metrics: dict[str, float]


class MetricsHistory(BaseModel):
    """`GET /v1/jobs/{id}/metrics`: every published step in order (`?format=csv` for CSV)."""

    job_id: str
    items: list[MetricsRow]


class Checkpoint(BaseModel):
    name: str = Field(description="e.g. step-000010")
    step: int
    size_bytes: int
    created_at: datetime
    download_url: str = Field(description="GET it for a .tar of the checkpoint folder")


class CheckpointList(BaseModel):
    """`GET /v1/jobs/{id}/checkpoints`, oldest first; `final_model_url` once the job succeeded."""

    job_id: str
    items: list[Checkpoint]
    final_model_url: str | None = None


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: str | None = None


# Server-sent events of `GET /v1/jobs/{id}/events` (`event:` name -> `data:` JSON):
#   status      {"status": JobStatus, "at": iso8601}
#   metrics     {"step": int, "total": int, "metrics": {name: float}}
#   checkpoint  {"step": int, "name": "step-000010"}
#   log         {"message": str, "at": iso8601}
#   done        {"status": "succeeded" | "failed" | "cancelled"}
# `id:` is the Redis stream entry id ("1700000000000-0"); send it back as Last-Event-ID.
