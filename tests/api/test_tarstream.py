"""Streamed tar downloads: the archive is whole, and an abandoned download stops its thread."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import threading
import time
from pathlib import Path

from api.tarstream import tar_stream


def make_folder(root: Path) -> Path:
    folder = root / "step-000004"
    (folder / "sub").mkdir(parents=True)
    (folder / "meta.json").write_text('{"step": 4}')
    (folder / "sub" / "weights.bin").write_bytes(os.urandom(3_000_000))
    return folder


def test_stream_is_a_complete_tar(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in tar_stream(folder)])

    data = asyncio.run(collect())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = set(tar.getnames())
        weights = tar.extractfile("step-000004/sub/weights.bin")
        assert weights is not None
        assert weights.read() == (folder / "sub" / "weights.bin").read_bytes()
    assert {"step-000004/meta.json", "step-000004/sub/weights.bin"} <= names


def test_abandoned_download_stops_the_writer_thread(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)

    async def first_chunk_only() -> None:
        stream = tar_stream(folder)
        assert await anext(stream)
        await stream.aclose()  # what the server does when the client disconnects

    asyncio.run(first_chunk_only())
    deadline = time.monotonic() + 5
    while any(t.name == "tar step-000004" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the tar thread is still running"
        time.sleep(0.05)
