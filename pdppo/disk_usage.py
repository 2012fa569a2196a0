"""What a tenant keeps on disk, and removing a job's folder: shared by the API (`GET /v1/usage`,
the storage quota, `DELETE /v1/jobs/{id}`) and the workers' retention pass.

Bytes are measured on disk rather than counted as they are written: checkpoints are written by
job processes, rotated by the trainer and removed by retention, and a counter kept by all of
them would drift with every crash in between, while a walk of the tenant's folders is always
right and cheap at the scale of a tenant's folders (a few files per checkpoint; the API keeps
the result for PDPPO_USAGE_CACHE_SECONDS). A file is counted once however many links it has:
a job's `inputs/` links to an upload hold no bytes of their own (du's rule), and once the upload
is deleted its bytes are the job's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from pdppo.files import TEMP_PREFIX, TEMP_SUFFIX, FileStorage

JOB_ID_RE = re.compile(r"^[0-9a-f]{24}$")
"""`pdppo.store.keys.new_job_id`: the only folder names under the artifact store that are jobs'."""


@dataclass(frozen=True)
class DiskUsage:
    files: int  # uploads (`<artifact_dir>/files/<tenant>`)
    artifacts: int  # the tenant's job folders (`<artifact_dir>/<job id>`)

    @property
    def total(self) -> int:
        return self.files + self.artifacts


def _walk(folder: Path, seen: set[tuple[int, int]]) -> int:
    """Bytes of the regular files under `folder` not in `seen` (symlinks not followed), but
    uploads being written (`.upload-*.part`): an upload is counted once it is a file, and the
    quota check of an upload must not count the upload itself twice."""
    total = 0
    stack = [str(folder)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed while we walked
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.name.startswith(TEMP_PREFIX) and entry.name.endswith(TEMP_SUFFIX):
                    continue
                elif entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    if (info.st_dev, info.st_ino) not in seen:
                        seen.add((info.st_dev, info.st_ino))
                        total += info.st_size
    return total


def measure(artifact_dir: Path, tenant: str, job_ids: Iterable[str]) -> DiskUsage:
    """The tenant's bytes: its uploads, then its jobs' folders. Blocking: run it in a thread."""
    seen: set[tuple[int, int]] = set()
    files = _walk(FileStorage(artifact_dir).tenant_dir(tenant), seen)
    artifacts = sum(_walk(artifact_dir / j, seen) for j in job_ids if JOB_ID_RE.match(j))
    return DiskUsage(files=files, artifacts=artifacts)


def remove_job_dir(artifact_dir: Path, job_id: str, keep: Iterable[str] = ()) -> list[str]:
    """Removes job `job_id`'s folder, or only what is in it apart from the names in `keep`;
    returns the names removed, sorted. Nothing there is not an error (the job never started, or
    another process removed it first); any other error is raised, so that the caller keeps the
    job in the purge set and a later pass tries again."""
    if not JOB_ID_RE.match(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    folder = artifact_dir / job_id
    kept = set(keep)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        if entry.name in kept:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, onerror=_gone_is_fine)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        removed.append(entry.name)
    if not kept:
        with contextlib.suppress(FileNotFoundError):
            folder.rmdir()
    return removed


def _gone_is_fine(
    function: Callable[..., Any],
    path: str,
    exc_info: tuple[type[BaseException], BaseException, TracebackType],
) -> None:
    """`shutil.rmtree`'s error handler: a file removed by someone else meanwhile is fine."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
