"""Folders that appear whole or not at all: the final model and the checkpoints.

A reader (the API's tar download, a `job:<id>` model, a resume) must never see a folder that a
killed process left half-written, nor one that is being removed file by file. So a folder is
only ever changed by renaming it as a whole:

- it is written under a temporary name, every file and folder in it fsync'ed, then renamed to
  its name and the parent fsync'ed (after a power cut the rename is either there, with all the
  data, or not there at all);
- it is removed by renaming it away first (`discard_dir`), then deleting the renamed copy: a
  reader that opened it by its name before the rename has it whole, one that comes after finds
  nothing (`api.storage.tarstream` checks the name still leads to the folder it opened).

`os.rename` cannot replace a non-empty folder, so `replace_dir` renames the old one away first:
for a moment the name leads nowhere, which a reader takes for "not there" (never for a mix).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from core.disk.storage import remove_quietly, require_free, writing

TMP_SUFFIX = ".tmp"
_DISCARDED = ".discarded-"


def write_dir_atomically(final: Path, write: Callable[[Path], object], needed: int = 0) -> Path:
    """`write(tmp)` fills a fresh temporary folder, which then becomes `final` (replacing any
    folder of that name). When `write` raises (or the process dies) `final` is untouched and
    the temporary folder is removed (or left for the next call, which removes it first).
    `needed`: the bytes it will take, refused up front (StorageFull) when the disk, less its
    reserve, has not got them; a disk error midway comes out as StorageFull / StorageError too
    (`core.disk.storage`), so a full disk is not reported as the trainer's own error."""
    final = Path(final)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    remove_quietly(tmp)  # a killed writer's
    require_free(final.parent, needed, f"{final.name}/")
    with writing(tmp, needed):
        tmp.mkdir(parents=True)
        write(tmp)
        return replace_dir(tmp, final)


def replace_dir(tmp: Path, final: Path) -> Path:
    """`tmp`, complete, becomes `final`: its contents fsync'ed, the old `final` renamed away and
    removed, the rename made durable."""
    _fsync_tree(tmp)
    old = _rename_away(final)
    os.rename(tmp, final)
    _fsync(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def discard_dir(path: Path) -> None:
    """Remove the folder `path` so that no reader sees it part-removed; nothing if absent.
    Never raises: a failed removal leaves a `.discarded-*` folder, not a half one under `path`."""
    old = _rename_away(Path(path))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _rename_away(path: Path) -> Path | None:
    away = path.with_name(f".{path.name}{_DISCARDED}{uuid.uuid4().hex[:12]}")
    try:
        os.rename(path, away)
    except FileNotFoundError:
        return None
    except OSError:
        return None  # not ours to report here: the caller's rename or write will
    return away


def _fsync_tree(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            _fsync(Path(folder) / name)
        _fsync(Path(folder))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
