"""Job records (Redis hashes) to the public `api.schemas.Job`."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from fastapi.responses import Response

from api.schemas import Job, JobError, JobPhase, Progress
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
            "spec": record.current_spec,
            "progress": Progress(step=record.step, total=record.total_steps),
            "metrics": record.metrics,
            "error": error,
            "cancel_requested": record.cancel_requested,
            "pause_requested": record.pause_requested,
            "config_version": record.config_version,
            "overrides": record.overrides,
            "attempts": record.attempts,
            "phase": _phase(record),
            "warnings": list(record.warnings),
            "trackers": record.trackers or {},
            "experiment": record.experiment,
        }
    )


def _phase(record: JobRecord) -> JobPhase | None:
    """The phase while running (a paused or ended job is doing nothing); training's progress is
    the record's step, which moves with every step where the phase event does not."""
    if record.status != "running" or record.phase is None:
        return None
    phase = JobPhase.model_validate(record.phase)
    if phase.name == "training":
        phase = JobPhase(name="training", done=record.step, total=record.total_steps)
    return phase


class StepRow(Protocol):
    @property
    def step(self) -> int: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


def steps_csv(rows: Sequence[StepRow], filename: str) -> Response:
    """Per-step rows as a CSV download: a `step` column, then one column per metric name seen in
    any row (sorted), empty where a row lacks it. Metrics and evaluations share it."""
    names = sorted({name for row in rows for name in row.metrics})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["step", *names])
    for row in rows:
        writer.writerow([row.step, *(row.metrics.get(name, "") for name in names)])
    return Response(
        buffer.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
