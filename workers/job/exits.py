"""How a job process ended, in words a user can act on: the error code of the exception it
reports (`error_code`, also a rank's), or, when it could not say so itself, of its exit."""

from __future__ import annotations

import signal
from pathlib import Path

from core.disk.storage import StorageError
from workers.job.storage import storage_code


def describe_exit(exitcode: int | None, oom_killed: bool) -> tuple[str, str]:
    """(error code, message) for a job process that died without reporting a result."""
    if oom_killed:
        return (
            "out_of_memory",
            "the job ran out of memory and the kernel's OOM killer ended it; "
            "make the job smaller (pdppo train --dry-run shows its memory estimate)",
        )
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = (
            " (the kernel's OOM killer sends SIGKILL when memory runs out)"
            if -exitcode == signal.SIGKILL
            else ""
        )
        return "killed", f"the job's process was killed by {name}{hint}"
    return "crashed", f"the job's process exited with code {exitcode} without a result"


def _oom_counter_files() -> list[Path]:
    """Where the kernel counts OOM kills in this process's memory cgroup: `memory.events` under
    cgroup v2, `memory.oom_control` under v1 (inside a container, its cgroup is the mount's
    root, whatever path /proc/self/cgroup names)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            found += [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"]
        elif "memory" in controllers.split(","):
            root = Path("/sys/fs/cgroup/memory")
            found += [root / path.lstrip("/") / "memory.oom_control", root / "memory.oom_control"]
    return [f for f in found if f.is_file()]


def oom_kills() -> int:
    """OOM kills so far in this worker's cgroup (0 where the kernel does not tell): a count that
    grows while a job ran and then died on SIGKILL means the kernel ended it for memory."""
    for path in _oom_counter_files():
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return 0


def error_code(exc: BaseException) -> str:
    """`invalid_input` for data or a model the job may not or cannot read (the user's to fix),
    `storage_full` or `storage_error` for a write the disk refused (`as_storage_error` tells
    them from other errors), `out_of_memory`, else `training_error`."""
    from core.disk.safe_files import UnsafeFileError

    if isinstance(exc, UnsafeFileError):
        return "invalid_input"
    if isinstance(exc, StorageError):
        return storage_code(exc)
    return "out_of_memory" if is_out_of_memory(exc) else "training_error"


def is_out_of_memory(exc: BaseException) -> bool:
    """torch reports a failed host allocation as a RuntimeError, CUDA's as OutOfMemoryError."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text
    )
