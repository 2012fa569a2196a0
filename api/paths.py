"""Which files on the workers a tenant's job spec may read.

A spec can name a local model (`hf:/models/x`) or dataset (`task.path`). Left unchecked, a
tenant could point a job at another tenant's artifacts or at any file the worker can read, so
local paths must lie under one of the operator's `PDPPO_DATA_ROOTS`. Hub ids (`org/name`) are
not paths and pass. The API cannot see the workers' file system, so this is a lexical check
(normalised, no `..` escapes): keep the data roots free of symlinks that lead out of them.
"""

from __future__ import annotations

import os
import re
from pathlib import PurePosixPath

from pdppo.spec import JobSpec

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def _is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and ".." not in name


def _outside_roots(path: str, roots: list[str]) -> str | None:
    """Why `path` may not be read, or None when it lies under a root."""
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


def forbidden_paths(spec: JobSpec, roots: list[str]) -> list[str]:
    """One message per field of `spec` naming a local path outside the data roots."""
    problems = []
    model = spec.train.model.name
    if model.startswith("hf:") and not _is_hub_id(model[3:]):
        why = _outside_roots(model[3:], roots)
        if why:
            problems.append(f"train.model.name: {model!r} {why}")
    if spec.train.task.path is not None:
        why = _outside_roots(spec.train.task.path, roots)
        if why:
            problems.append(f"train.task.path: {spec.train.task.path!r} {why}")
    return problems
