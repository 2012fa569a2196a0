"""Which files on the workers a tenant's job spec may read.

A spec can name a local model (`hf:/models/x`) or dataset (`task.path`, `task.validation_path`).
Left unchecked, a tenant could point a job at another tenant's artifacts or at any file the worker
can read, so local paths must lie under one of the operator's `PDPPO_DATA_ROOTS`. Hub ids
(`org/name`) are not paths and pass; a relative path is never resolved against some process's
working folder.

The API need not share the workers' file system, so the check that always runs here is lexical
(absolute, normalised, no `..` escapes). The real check runs where the file is opened: the
worker resolves symlinks before checking the roots and opens regular files only
(`core.disk.safe_files`). When a named path does exist on the API host (a data root the API shares
with the workers, as in `pdppo dev`), the API runs the same checks at submit, so a FIFO, a
device or a symlink out of the roots is a 422 now rather than a failed job later.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Literal

from core.disk.safe_files import is_hub_id, path_problem
from pdppo.spec import JobSpec


def _outside_roots(path: str, roots: list[str]) -> str | None:
    """Why `path` may not be read, or None when it lies under a root (lexically)."""
    if not roots:
        return "local paths are disabled on this server (its PDPPO_DATA_ROOTS is empty)"
    if not path.startswith("/"):
        return f"must be an absolute path under one of {roots}"
    normal = os.path.normpath(path)
    for root in roots:
        root_normal = os.path.normpath(root)
        if PurePosixPath(normal).is_relative_to(root_normal):
            return None
    return f"is not under any of the allowed data roots {roots}"


def _on_this_host(path: str, roots: list[str], want: Literal["file", "dir"]) -> str | None:
    """The worker's own checks (symlinks resolved, file type, size), when this host has `path`;
    None when it has not: the workers' file system may differ from the API's."""
    return path_problem(path, roots, want=want) if os.path.lexists(path) else None


def forbidden_paths(spec: JobSpec, roots: list[str]) -> list[str]:
    """One message per field of `spec` naming a local path the workers would refuse to read."""
    problems = []
    model = spec.train.model.name
    source = model.removeprefix("hf:")
    if model.startswith("hf:") and not is_hub_id(source):
        why = _outside_roots(source, roots) or _on_this_host(source, roots, "dir")
        if why:
            problems.append(f"train.model.name: {model!r} {why}")
    elif model.startswith("hf:") and os.path.lexists(source):
        # hub-id-shaped, but also names a file relative to this process's working directory, which
        # `from_pretrained` would read instead of the hub: the workers refuse it, so refuse now
        problems.append(
            f"train.model.name: {model!r} names a file relative to the server's working "
            f"directory, not a hub id; give a local model as an absolute path under one of {roots}"
        )
    for name in ("path", "validation_path"):  # a held-out file is read like the dataset
        path = getattr(spec.train.task, name)
        if path is not None:
            why = _outside_roots(path, roots) or _on_this_host(path, roots, "file")
            if why:
                problems.append(f"train.task.{name}: {path!r} {why}")
    return problems
