"""A folder as a streamed .tar: the first bytes leave at once, nothing is staged on disk.

Checkpoints of real models are gigabytes; building the archive first would double the disk use
and keep the client waiting (and timing out) before the first byte. A thread writes the tar into
a small bounded queue that the response drains; if the client goes away, the thread stops.
"""

from __future__ import annotations

import io
import queue
import tarfile
import threading
from collections.abc import AsyncIterator
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


def _produce(folder: Path, out: queue.Queue[_Item], stop: threading.Event) -> None:
    try:
        with tarfile.open(fileobj=_Sink(out, stop), mode="w|", bufsize=CHUNK) as tar:
            tar.add(folder, arcname=folder.name)
        _put(out, None, stop)
    except _Cancelled:
        return
    except BaseException as exc:  # reported to the response, which cuts the stream short
        try:
            _put(out, exc, stop)
        except _Cancelled:
            return


def _take(chunks: queue.Queue[_Item], stop: threading.Event) -> _Item | _Cancelled:
    while not stop.is_set():
        try:
            return chunks.get(timeout=_POLL)
        except queue.Empty:
            continue
    return _Cancelled()


async def tar_stream(folder: Path) -> AsyncIterator[bytes]:
    chunks: queue.Queue[_Item] = queue.Queue(maxsize=16)
    stop = threading.Event()
    threading.Thread(
        target=_produce, args=(folder, chunks, stop), name=f"tar {folder.name}", daemon=True
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
