"""The job process's side of disk space (`core.disk.storage`): room checked before a job starts, and
a failed write told apart from a training error.

A job that would fill the disk half-way through is refused before it loads its model: the first
checkpoint it will write (a resumed job: the size of its latest one; a fresh job: its trainable
weights and their two Adam moments, from the budget's parameter count) plus the operator's
reserve must fit in its folder, else it fails with `storage_full` and a message naming the
folder, the free and the needed bytes. Its checkpoints stay, so `pdppo resume` continues it once
space is back. What an earlier run of the job left half-written (`*.tmp`) is removed first:
a run killed mid-save must not hold space for the jobs after it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from core.config import TrainConfig
from core.disk.storage import (
    ADAM_STATES,
    Reserve,
    StorageError,
    StorageFull,
    folder_bytes,
    remove_stale_temps,
    require_free,
    set_reserve,
    storage_failure,
)

log = logging.getLogger(__name__)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def first_write_bytes(
    cfg: TrainConfig, out_dir: Path, data_roots: list[str], model_dir: Path | None
) -> int:
    """Bytes of the next checkpoint the job will write (0 when its model's size is unknown)."""
    from core.budget import model_shape
    from core.training.checkpoint import latest_checkpoint

    latest = latest_checkpoint(out_dir)
    if latest is not None:
        return folder_bytes(latest)
    shape = model_shape(cfg, read_files=True, data_roots=data_roots, model_dir=model_dir)
    trainable = shape.trainable if shape.trainable is not None else shape.params
    if trainable is None:
        return 0
    return trainable * DTYPE_BYTES.get(cfg.model.dtype, 4) * (1 + ADAM_STATES)


def refuse_for_storage(
    cfg: TrainConfig,
    out_dir: Path,
    reserve: Reserve,
    data_roots: list[str],
    model_dir: Path | None,
) -> StorageFull | None:
    """Sets this process's reserve, clears the job's stale temporary folders, and says why the
    job cannot start for lack of space (None: it can)."""
    set_reserve(reserve)
    clear_temps(out_dir)
    needed = first_write_bytes(cfg, out_dir, data_roots, model_dir)
    try:
        require_free(out_dir, needed, "the job's next checkpoint (estimated)", reserve)
    except StorageFull as full:
        return full
    return None


def clear_temps(out_dir: Path) -> None:
    """Removes the job's half-written folders (`*.tmp`: checkpoints, the final model's) left by
    a run that was killed mid-write. Only while no run of the job can be writing: before one
    starts, or after its process ended under the same claim."""
    for folder in (out_dir, out_dir / "checkpoints"):
        for stale in remove_stale_temps(folder):
            log.info("removed %s, left half-written by a run that did not finish", stale)


def as_storage_error(exc: BaseException, folder: Path) -> StorageError | None:
    """`exc`, raised by a job writing under `folder` (its own), as the disk error it is (the
    original as its cause), or None: not the disk's."""
    if isinstance(exc, StorageError):
        return exc
    if not isinstance(exc, Exception):
        return None
    failure = storage_failure(exc, folder)
    if failure is not None:
        failure.__cause__ = exc
    return failure


def storage_code(failure: StorageError) -> str:
    return "storage_full" if isinstance(failure, StorageFull) else "storage_error"
