"""What a job reports besides its training metrics: held-out evaluations and rollout samples.

Both are kept in Redis next to the metrics rows (one list per job, written by the worker in the
same script as the event it publishes), so they are served like `GET /v1/jobs/{id}/metrics`:
JSON by default, CSV for the evaluations (one row per evaluated step).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response

from api.deps import JobDep, StoreDep
from api.jobs.convert import steps_csv
from api.schemas import EvalHistory, EvalRow, SamplesHistory, SamplesRow
from pdppo.store.jobs.worker_side import SAMPLES_KEPT

router = APIRouter(prefix="/v1/jobs", tags=["results"])


@router.get(
    "/{job_id}/eval",
    response_model=EvalHistory,
    responses={200: {"content": {"text/csv": {}}}},
)
async def eval_history(
    job: JobDep,
    store: StoreDep,
    format: Annotated[
        Literal["json", "csv"] | None,
        Query(description="json or csv; unset: CSV if Accept asks for text/csv, else JSON"),
    ] = None,
    accept: Annotated[str | None, Header(description="text/csv for CSV")] = None,
) -> EvalHistory | Response:
    """Every held-out evaluation (`train.eval_every`) in step order. CSV: a `step` column, then
    one column per metric (empty where a row lacks it)."""
    rows = [EvalRow.model_validate(r) for r in await store.events.eval_history(job.id)]
    if (format or _format_from(accept)) == "json":
        return EvalHistory(job_id=job.id, items=rows)
    return steps_csv(rows, f"{job.id}-eval.csv")


def _format_from(accept: str | None) -> Literal["json", "csv"]:
    """CSV when the client accepts text/csv and not JSON (a browser's `*/*` gets JSON)."""
    types = {part.split(";", 1)[0].strip().lower() for part in (accept or "").split(",")}
    return "csv" if "text/csv" in types and "application/json" not in types else "json"


@router.get("/{job_id}/samples", response_model=SamplesHistory)
async def samples_history(
    job: JobDep,
    store: StoreDep,
    limit: Annotated[
        int, Query(ge=1, le=SAMPLES_KEPT, description="how many of the newest rows")
    ] = 20,
) -> SamplesHistory:
    """Prompt/completion/reward triples of the rollouts (`train.log_samples_every`), one row
    per logged step, newest last. The job keeps its newest 1000 rows."""
    rows = await store.events.samples_history(job.id, limit)
    return SamplesHistory(job_id=job.id, items=[SamplesRow.model_validate(r) for r in rows])


__all__ = ["router"]
