"""A real small file system for tests of a full disk: a tmpfs of a few MiB mounted on a folder.

Nothing short of a real one shows what torch, safetensors and the kernel do when a write meets
ENOSPC (torch's error hides the errno; a close may be the call that fails). Mounting needs root,
which CI has; elsewhere the tests that need it are skipped, saying why. The mount is always
undone, even when the test fails (a lazy unmount if something still holds a file there).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.disk.storage import free_bytes

PAGE = 4096


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """`path` (made if missing) as a tmpfs of `size` bytes for the block's duration."""
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    try:
        subprocess.run(mount, check=True, capture_output=True, timeout=30)
    except (subprocess.CalledProcessError, FileNotFoundError, PermissionError) as exc:
        pytest.skip(f"cannot mount a tmpfs on {path} ({exc}): these tests need root, as in CI")
    try:
        yield path
    finally:
        done = subprocess.run(["umount", str(path)], capture_output=True, timeout=30)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(folder: Path, leave: int, name: str = "filler") -> Path:
    """A file in `folder` that takes all but about `leave` bytes of its disk (to a page)."""
    target = folder / name
    size = max(0, free_bytes(folder) - leave) // PAGE * PAGE
    with target.open("wb") as fh:
        chunk = b"\0" * (1 << 20)
        left = size
        while left > 0:
            left -= fh.write(chunk[: min(left, len(chunk))])
    assert abs(free_bytes(folder) - leave) <= 2 * PAGE, (free_bytes(folder), leave)
    return target


def names(folder: Path) -> list[str]:
    """Every entry under `folder`, relative, sorted: what a failed write left behind."""
    return sorted(
        os.path.relpath(os.path.join(root, n), folder)
        for root, dirs, files in os.walk(folder)
        for n in [*dirs, *files]
    )
