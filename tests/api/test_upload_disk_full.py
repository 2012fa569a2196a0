"""An upload meeting a full disk, on a real tmpfs (`tests.support.small_disk`), without the
server: the write that fails is a 507 with nothing left behind, and the cleanup never raises, even
when the close it does fails too (flushing what is buffered, onto the full disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdppo.files import FileStorage
from tests.api.forms import form, leftovers, refused
from tests.support.small_disk import fill, small_disk

MIB = 1 << 20


@pytest.fixture
def disk(tmp_path: Path) -> object:
    with small_disk(tmp_path / "disk", MIB) as folder:
        (folder / "files" / "alice").mkdir(parents=True)
        yield folder


def test_a_full_disk_during_the_write_is_507_and_leaves_no_part_file(disk: Path) -> None:
    body = form(("file", "a.jsonl", b'{"prompt": "1=", "answer": "1"}\n' * 60_000))  # ~2 MB
    error = refused(disk, body, chunk=65536, limit=4 * MIB)
    assert error.status == 507
    assert error.detail.startswith("file: the server has no room left to store it")


def test_discard_removes_the_file_when_its_close_fails_for_no_space(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = FileStorage(disk).new_upload("alice", MIB)
    fill(disk, leave=0)
    writer.write(b"x" * 100)  # buffered: the disk is met at the close
    writer.discard()
    writer.discard()  # twice is fine
    assert leftovers(disk) == []
    assert "No space left on device" in caplog.text
