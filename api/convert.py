"""Job records (Redis hashes) to the public `api.schemas.Job`."""

from __future__ import annotations

from datetime import datetime

from api.schemas import Job, JobError, Progress
from pdppo.store import JobRecord


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def to_job(record: JobRecord) -> Job:
    error = None
    if record.error_code:
        # `record.error_traceback` stays in Redis for operators: see `JobError`.
        error = JobError(code=record.error_code, message=record.error_message or "")
    return Job.model_validate(
        {
            "id": record.id,
            "name": record.name,
            "status": record.status,
            "queue": record.queue,
            "created_at": _ts(record.created_at),
            "updated_at": _ts(record.updated_at),
            "started_at": _ts(record.started_at),
            "finished_at": _ts(record.finished_at),
            "spec": record.spec,
            "progress": Progress(step=record.step, total=record.total_steps),
            "metrics": record.metrics,
            "error": error,
            "cancel_requested": record.cancel_requested,
            "attempts": record.attempts,
        }
    )
