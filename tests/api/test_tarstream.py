"""Streamed tar downloads: the archive is whole, also when its folder is replaced or removed
while it streams, and an abandoned download stops its thread."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from api.storage.tarstream import open_snapshot, tar_stream


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


def files_of(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        out = {}
        for member in tar.getmembers():
            if member.isfile():
                got = tar.extractfile(member)
                assert got is not None
                out[member.name] = got.read()
        return out


def two_file_folder(root: Path, fill: bytes) -> Path:
    """final/ with two files of 4 MB each: more than the queue holds (1 MiB), so the stream is
    paused in the middle of the first one."""
    folder = root / "final"
    folder.mkdir()
    (folder / "config.json").write_bytes(fill * 4_000_000)
    (folder / "model.safetensors").write_bytes(fill * 4_000_000)
    return folder


def replace_whole(folder: Path) -> None:
    from core.disk.atomic_dir import write_dir_atomically

    def new(tmp: Path) -> None:
        (tmp / "config.json").write_bytes(b"N" * 4_000_000)
        (tmp / "model.safetensors").write_bytes(b"N" * 4_000_000)

    write_dir_atomically(folder, new)


def remove_in_place(folder: Path) -> None:
    shutil.rmtree(folder)


@pytest.mark.parametrize("change", [replace_whole, remove_in_place], ids=["replaced", "removed"])
def test_a_folder_changed_mid_stream_is_sent_whole_as_it_was(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    """The download began before the folder was replaced (a rename, as the trainer does) or
    deleted file by file: the tar is the old folder, whole (before: files of the new folder
    after the first, or a stream cut short at the first missing file)."""
    folder = two_file_folder(tmp_path, b"O")

    async def collect() -> bytes:
        stream = tar_stream(folder)
        first = await anext(stream)
        change(folder)
        return first + b"".join([chunk async for chunk in stream])

    assert files_of(asyncio.run(collect())) == {
        "final/config.json": b"O" * 4_000_000,
        "final/model.safetensors": b"O" * 4_000_000,
    }


def test_a_snapshot_of_a_missing_folder_or_a_symlink_is_none(tmp_path: Path) -> None:
    assert open_snapshot(tmp_path / "nothing") is None
    target = two_file_folder(tmp_path, b"O")
    (tmp_path / "link").symlink_to(target)
    assert open_snapshot(tmp_path / "link") is None


def test_symlinks_inside_are_left_out_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("another tenant's")
    folder = tmp_path / "step-000001"
    folder.mkdir()
    (folder / "meta.json").write_text("{}")
    (folder / "leak").symlink_to(secret)
    snap = open_snapshot(folder)
    assert snap is not None

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in tar_stream(snap)])

    assert files_of(asyncio.run(collect())) == {"step-000001/meta.json": b"{}"}
