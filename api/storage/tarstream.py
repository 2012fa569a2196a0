"""A folder as a streamed .tar: the first bytes leave at once, nothing is staged on disk.

Checkpoints of real models are gigabytes; building the archive first would double the disk use
and keep the client waiting (and timing out) before the first byte. A thread writes the tar into
a small bounded queue that the response drains; if the client goes away, the thread stops.

The archive is the folder as it was when the download began, whole, even if the folder is
replaced or removed while it streams (checkpoints rotate during a run; retention and deletion
remove folders): every file is opened before the first byte (`open_snapshot`), and an open file
keeps its bytes after its name is gone. Folders change only by being renamed as a whole
(`core.disk.atomic_dir`), so a snapshot whose folder still has its name once every file is open
holds one complete version of it, never a mix of two or a part of one.
"""

from __future__ import annotations

import errno
import io
import os
import queue
import stat
import tarfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio

CHUNK = 1 << 16
_POLL = 0.25
_Item = bytes | BaseException | None


class _Cancelled(Exception):
    pass


class _Sink(io.RawIOBase):
    def __init__(self, out: queue.Queue[_Item], stop: threading.Event) -> None:
        self.out = out
        self.stop = stop

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        _put(self.out, bytes(data), self.stop)
        return len(data)


def _put(out: queue.Queue[_Item], item: _Item, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            out.put(item, timeout=_POLL)
            return
        except queue.Full:
            continue
    raise _Cancelled


@dataclass
class Snapshot:
    """A folder's regular files and subfolders, each file open: `arcname`s relative to it."""

    name: str
    root: os.stat_result
    entries: list[tuple[str, os.stat_result, io.FileIO | None]] = field(default_factory=list)

    def close(self) -> None:
        for _, _, file in self.entries:
            if file is not None:
                file.close()


class _Changed(Exception):
    """The folder was renamed or removed while it was being opened."""


def open_snapshot(folder: Path, attempts: int = 3) -> Snapshot | None:
    """`folder` with every file opened, one whole version of it; None when there is no such
    folder (or it kept changing through `attempts` tries). Symlinks and special files inside
    are left out, never followed."""
    for _ in range(attempts):
        try:
            dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink
                return None
            raise
        snap = Snapshot(Path(folder).name, os.fstat(dfd))
        try:
            _walk(dfd, "", snap)
            now = os.stat(folder, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (snap.root.st_dev, snap.root.st_ino):
                raise _Changed
            return snap
        except (_Changed, FileNotFoundError, NotADirectoryError):
            snap.close()
        except BaseException:
            snap.close()
            raise
        finally:
            os.close(dfd)
    return None


def _walk(dfd: int, prefix: str, snap: Snapshot) -> None:
    for name in sorted(os.listdir(dfd)):
        info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        arcname = f"{prefix}{name}"
        if stat.S_ISDIR(info.st_mode):
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            try:
                snap.entries.append((arcname, os.fstat(sub), None))
                _walk(sub, arcname + "/", snap)
            finally:
                os.close(sub)
        elif stat.S_ISREG(info.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
            file = io.FileIO(fd, "rb", closefd=True)
            snap.entries.append((arcname, os.fstat(fd), file))


def _write_tar(snap: Snapshot, tar: tarfile.TarFile) -> None:
    def member(name: str, info: os.stat_result, kind: bytes) -> tarfile.TarInfo:
        item = tarfile.TarInfo(name)
        item.type, item.mode, item.mtime = kind, stat.S_IMODE(info.st_mode), int(info.st_mtime)
        return item

    tar.addfile(member(snap.name, snap.root, tarfile.DIRTYPE))
    for arcname, info, file in snap.entries:
        if file is None:
            tar.addfile(member(f"{snap.name}/{arcname}", info, tarfile.DIRTYPE))
            continue
        item = member(f"{snap.name}/{arcname}", info, tarfile.REGTYPE)
        item.size = info.st_size  # the size it had when opened: a file is never rewritten
        tar.addfile(item, file)


def _produce(source: Path | Snapshot, out: queue.Queue[_Item], stop: threading.Event) -> None:
    snap = open_snapshot(source) if isinstance(source, Path) else source
    try:
        if snap is None:
            raise FileNotFoundError(f"{source}: no such folder")
        with tarfile.open(fileobj=_Sink(out, stop), mode="w|", bufsize=CHUNK) as tar:
            _write_tar(snap, tar)
        _put(out, None, stop)
    except _Cancelled:
        return
    except BaseException as exc:  # reported to the response, which cuts the stream short
        try:
            _put(out, exc, stop)
        except _Cancelled:
            return
    finally:
        if snap is not None:
            snap.close()


def _take(chunks: queue.Queue[_Item], stop: threading.Event) -> _Item | _Cancelled:
    while not stop.is_set():
        try:
            return chunks.get(timeout=_POLL)
        except queue.Empty:
            continue
    return _Cancelled()


async def tar_stream(source: Path | Snapshot) -> AsyncIterator[bytes]:
    """The tar of `source`: a snapshot taken beforehand (`open_snapshot`: the API's, which
    answers 404 when there is none), or a folder, snapshotted before the first byte."""
    chunks: queue.Queue[_Item] = queue.Queue(maxsize=16)
    stop = threading.Event()
    name = source.name
    threading.Thread(
        target=_produce, args=(source, chunks, stop), name=f"tar {name}", daemon=True
    ).start()
    try:
        while True:
            item = await anyio.to_thread.run_sync(_take, chunks, stop)
            if item is None or isinstance(item, _Cancelled):
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
