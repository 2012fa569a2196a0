"""Disk space as a resource a run can run out of, and what a failed write leaves behind.

A full disk is not the trainer's fault and not the user's: a job that meets one must say so
(`StorageFull`, the worker's `storage_full`), keep the checkpoints it already has so that it can
be resumed once space is back, and leave nothing half-written that would fill the disk for the
jobs after it. So:

- `require_free` refuses a write before it starts, when the folder cannot hold what it will write
  plus the operator's reserve (`Reserve`: PDPPO_MIN_FREE_BYTES or PDPPO_MIN_FREE_RATIO, set once
  per job process by the worker, `set_reserve`);
- `writing(tmp)` wraps the write of a temporary folder (a checkpoint's `step-N.tmp`, the final
  model's): on any error the folder is removed, without the removal ever raising over the real
  error, and an error of the disk is raised as `StorageFull` or `StorageError`;
- `storage_failure` tells a disk error from any other. torch hides the errno of a failed
  `torch.save` ("[enforce fail at inline_container.cc:...] unexpected pos"), so for its stream
  writer's errors the free space left at the folder decides, measured before the cleanup frees it.

This module imports torch only for the estimate of a checkpoint's size.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_NO_SPACE_TEXT = ("no space left on device", "disk quota exceeded", "os error 28", "os error 122")
_TORCH_WRITER_TEXT = ("inline_container.cc", "pytorchstreamwriter", "basic_ios::clear")
TEMP_SUFFIX = ".tmp"
ADAM_STATES = 2  # exp_avg and exp_avg_sq, each the size of its parameter


class StorageError(Exception):
    """A write to the artifact folder failed for a reason of the disk's (an I/O error, a
    read-only file system): the worker's `storage_error`."""

    def __init__(self, message: str, folder: Path) -> None:
        super().__init__(message)
        self.folder = folder


class StorageFull(StorageError):
    """The folder has no room for a write (or had none when it failed): `storage_full`."""

    def __init__(self, message: str, folder: Path, free: int, needed: int) -> None:
        super().__init__(message, folder)
        self.free = free
        self.needed = needed


@dataclass(frozen=True)
class Reserve:
    """Space kept free on the artifact folder's disk: no write may leave less than the larger of
    `min_bytes` and `ratio` of the disk's size (logs, Redis's AOF, the API's uploads share it)."""

    min_bytes: int = 0
    ratio: float = 0.0

    def bytes_for(self, folder: Path) -> int:
        if self.ratio <= 0:
            return self.min_bytes
        return max(self.min_bytes, int(self.ratio * disk_total(folder)))


_reserve = Reserve()


def set_reserve(reserve: Reserve) -> None:
    """The reserve every later check of this process keeps (a job process's, from its worker's
    settings: one job per process, so a process-wide value is the job's)."""
    global _reserve
    _reserve = reserve


def current_reserve() -> Reserve:
    return _reserve


def _existing(path: Path) -> Path:
    """`path` or its nearest existing parent: a folder not made yet is on its parent's disk."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on `path`'s file system."""
    return shutil.disk_usage(_existing(path)).free


def disk_total(path: Path) -> int:
    return shutil.disk_usage(_existing(path)).total


def require_free(folder: Path, needed: int, what: str, reserve: Reserve | None = None) -> None:
    """StorageFull unless `folder` has room for `needed` bytes (`what` they are, for the
    message) and the reserve after them."""
    keep = (reserve or _reserve).bytes_for(folder)
    free = free_bytes(folder)
    if free < needed + keep:
        raise StorageFull(
            f"not enough free space in {folder} for {what}: {free} bytes free, {needed + keep} "
            f"needed ({needed} to write and {keep} kept free, PDPPO_MIN_FREE_BYTES / "
            "PDPPO_MIN_FREE_RATIO); free some space, then resume the job",
            Path(folder),
            free,
            needed + keep,
        )


def folder_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (0 when it is gone)."""
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def checkpoint_bytes(
    previous: Path | None,
    trainable: list[torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None,
) -> int:
    """What the next checkpoint will take: the previous one's size when there is one (the same
    tensors again), else the trainable weights plus the optimizer's state (two Adam moments
    per weight before its first step has made them)."""
    if previous is not None:
        size = folder_bytes(previous)
        if size:
            return size
    weights = sum(t.numel() * t.element_size() for t in trainable)
    states = 0
    if optimizer is not None:
        import torch

        for per_param in optimizer.state.values():
            for value in per_param.values():
                if isinstance(value, torch.Tensor):
                    states += value.numel() * value.element_size()
    return weights + (states if states else ADAM_STATES * weights)


def is_no_space(exc: BaseException) -> bool:
    """The error, or one it was raised from or during, says the disk (or a quota) is full."""
    for err in _chain(exc):
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS:
            return True
        text = str(err).lower()
        if any(marker in text for marker in _NO_SPACE_TEXT):
            return True
    return False


def _is_torch_write_error(exc: BaseException) -> bool:
    return any(
        isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _TORCH_WRITER_TEXT)
        for err in _chain(exc)
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def storage_failure(exc: BaseException, folder: Path, needed: int = 0) -> StorageError | None:
    """What `exc`, raised while writing under `folder`, says of the disk: StorageFull when it
    was full (by errno or text; for torch's stream writer, whose errno is lost, by the free
    space left there, below `needed` or the reserve), StorageError for another OSError on the
    folder, None when the error is not the disk's."""
    if isinstance(exc, StorageError):
        return exc
    where = _failed_folder(exc) or Path(folder)
    try:
        free = free_bytes(where)
    except OSError:
        free = -1  # the disk cannot even be asked: full only if the error says so
    cause = f"{type(exc).__name__}: {exc}"
    if is_no_space(exc) or (
        _is_torch_write_error(exc) and 0 <= free < max(needed, 1) + _reserve.bytes_for(where)
    ):
        return StorageFull(
            f"no space left in {where} ({free} bytes free): {cause}; free some space, then "
            "resume the job",
            where,
            free,
            needed,
        )
    if _is_torch_write_error(exc) or (isinstance(exc, OSError) and _under(exc, folder)):
        return StorageError(f"could not write to {where}: {cause}", where)
    return None


def _failed_folder(exc: BaseException) -> Path | None:
    """The folder of the path the error names, if it names one: a full disk elsewhere (the
    machine's /tmp, a cache) is named as it is, not as the job's folder."""
    for err in _chain(exc):
        if isinstance(err, OSError) and err.filename:
            return Path(os.fsdecode(err.filename)).absolute().parent
    return None


def _under(exc: OSError, folder: Path) -> bool:
    names = [n for n in (exc.filename, exc.filename2) if n]
    root = Path(folder).absolute()
    return any(Path(os.fsdecode(n)).absolute().is_relative_to(root) for n in names)


def remove_quietly(path: Path) -> None:
    """Removes a file or folder; a failure is logged, never raised (it runs while another
    error is on its way up, and must not replace it)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    except Exception as exc:  # the real error is the one being raised: never replace it
        log.warning("could not remove %s: %s", path, exc)


def remove_stale_temps(folder: Path) -> list[Path]:
    """Removes the `*.tmp` entries of `folder` (left by a process killed mid-write: a job's own
    folder has one writer, so none of them is in use when its run starts or writes anew)."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(Path(folder).iterdir()):
            if entry.name.endswith(TEMP_SUFFIX):
                remove_quietly(entry)
                removed.append(entry)
    return removed


@contextlib.contextmanager
def writing(tmp: Path, needed: int = 0) -> Iterator[Path]:
    """The write of the temporary folder `tmp` (renamed into place by the caller inside the
    block): on any error it is removed, and an error of the disk comes out as StorageFull or
    StorageError, raised from the original. `needed`: bytes the write was to take."""
    try:
        yield tmp
    except BaseException as exc:
        failure = storage_failure(exc, tmp.parent, needed) if isinstance(exc, Exception) else None
        remove_quietly(tmp)
        if failure is None or failure is exc:
            raise
        raise failure from exc
