"""Metrics history, checkpoints and the final model of a job."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response, StreamingResponse

from api.deps import JobDep, SettingsDep, StoreDep
from api.jobs.convert import steps_csv
from api.schemas import Checkpoint, CheckpointList, MetricsHistory, MetricsRow
from api.storage.tarstream import open_snapshot, tar_stream
from pdppo.store import JobRecord

router = APIRouter(prefix="/v1/jobs", tags=["artifacts"])
_CHECKPOINT = re.compile(r"^step-(\d{1,12})$")


@router.get(
    "/{job_id}/metrics",
    response_model=MetricsHistory,
    responses={200: {"content": {"text/csv": {}}}},
)
async def metrics_history(
    job: JobDep,
    store: StoreDep,
    format: Annotated[Literal["json", "csv"], Query(description="json (default) or csv")] = "json",
) -> MetricsHistory | Response:
    """Every published step in step order. CSV: a `step` column, then one column per metric."""
    rows = [MetricsRow.model_validate(r) for r in await store.metrics_history(job.id)]
    if format == "json":
        return MetricsHistory(job_id=job.id, items=rows)
    return steps_csv(rows, f"{job.id}-metrics.csv")


def _job_dir(settings_dir: Path, job_id: str) -> Path:
    return settings_dir / job_id


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@router.get("/{job_id}/checkpoints", response_model=CheckpointList)
async def list_checkpoints(job: JobDep, settings: SettingsDep) -> CheckpointList:
    """Checkpoints on disk, oldest first (the trainer keeps the most recent few)."""
    root = _job_dir(settings.artifact_dir, job.id)
    return await anyio.to_thread.run_sync(_scan, root, job)


def _scan(root: Path, job: JobRecord) -> CheckpointList:
    """A checkpoint that the trainer rotates away while this reads it is left out (it was
    there a moment ago; it is not now), not a 500."""
    items = []
    folder = root / "checkpoints"
    dirs = sorted(folder.iterdir()) if folder.is_dir() else []
    for path in dirs:
        match = _CHECKPOINT.match(path.name)
        if not match or not path.is_dir():
            continue
        try:
            size, mtime = _size(path), path.stat().st_mtime
        except FileNotFoundError:
            continue
        items.append(
            Checkpoint(
                name=path.name,
                step=int(match.group(1)),
                size_bytes=size,
                created_at=datetime.fromtimestamp(mtime, UTC),
                download_url=f"/v1/jobs/{job.id}/checkpoints/{path.name}",
            )
        )
    items.sort(key=lambda c: c.step)
    final = _has_final_model(job) and (root / "final").is_dir()
    final_url = f"/v1/jobs/{job.id}/model" if final else None
    return CheckpointList(job_id=job.id, items=items, final_model_url=final_url)


@router.get(
    "/{job_id}/checkpoints/{name}",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}}},
)
async def download_checkpoint(job: JobDep, name: str, settings: SettingsDep) -> StreamingResponse:
    """The checkpoint folder as a .tar (`name` from the list, e.g. step-000010)."""
    if not _CHECKPOINT.match(name):
        raise HTTPException(404, detail=f"checkpoint {name!r} not found")
    folder = _job_dir(settings.artifact_dir, job.id) / "checkpoints" / name
    return await _tar_response(folder, f"{job.id}-{name}.tar", f"checkpoint {name!r} not found")


@router.get(
    "/{job_id}/model",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}}},
)
async def download_model(job: JobDep, settings: SettingsDep) -> StreamingResponse:
    """The final model folder as a .tar, once the job has succeeded: for an `hf:` job a
    standard Hugging Face folder (safetensors, config.json, generation_config.json, the
    tokenizer and its chat template; a LoRA job's PEFT adapter in adapter/), for a
    `builtin:tiny` job pdppo's own format, not loadable by transformers (see its README.md)."""
    if not _has_final_model(job):
        raise HTTPException(404, detail=_no_final_model(job))
    folder = _job_dir(settings.artifact_dir, job.id) / "final"
    return await _tar_response(folder, f"{job.id}-model.tar", _no_final_model(job))


def _has_final_model(job: JobRecord) -> bool:
    """Only a succeeded job has one: a `final/` folder of a job that was cancelled, failed, or
    is still running (its process killed after the save, before the job's end was recorded)
    is not the model the job's record promises, whatever the disk holds."""
    return job.status == "succeeded"


def _no_final_model(job: JobRecord) -> str:
    if job.status == "succeeded":  # its artifacts are gone from the store
        return f"job {job.id!r} has no final model in the artifact store"
    if job.status in ("queued", "running", "paused"):
        return f"job {job.id!r} has no final model yet (it is {job.status})"
    return f"job {job.id!r} has no final model (it is {job.status}; only a succeeded job has one)"


async def _tar_response(folder: Path, filename: str, missing: str) -> StreamingResponse:
    snapshot = await anyio.to_thread.run_sync(open_snapshot, folder)
    if snapshot is None:
        raise HTTPException(404, detail=missing)
    return StreamingResponse(
        tar_stream(snapshot),
        media_type="application/x-tar",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


__all__ = ["router"]
