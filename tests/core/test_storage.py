"""A full disk under a training run, on a real tmpfs (`tests.support.small_disk`): the checkpoint
that does not fit is refused before it is written, one that fails mid-write leaves no temporary
folder, the earlier checkpoints stay and the run resumes from them once space is back."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest
import torch

import core.training.checkpoint
import core.training.run
import core.training.trainer
from core.disk.storage import (
    Reserve,
    StorageError,
    StorageFull,
    remove_quietly,
    require_free,
    set_reserve,
    storage_failure,
    writing,
)
from core.training.checkpoint import list_checkpoints
from core.training.trainer import train
from tests.support.small_disk import fill, names, small_disk
from tests.support.trainer_runs import small_config

MIB = 1 << 20


@pytest.fixture
def disk(tmp_path: Path) -> object:
    with small_disk(tmp_path / "disk", 1 * MIB) as folder:
        yield folder


@pytest.fixture(autouse=True)
def no_reserve() -> object:
    set_reserve(Reserve())
    yield
    set_reserve(Reserve())


def test_a_checkpoint_that_does_not_fit_is_refused_and_the_run_resumes_once_space_is_back(
    disk: Path,
) -> None:
    # one checkpoint of the tiny model (~600 kB) fits in 1 MiB, a second one beside it does not
    cfg = small_config(steps=4, checkpoint_every=2)
    with pytest.raises(StorageFull) as raised:
        train(cfg, disk)
    full = raised.value
    assert full.free < full.needed
    assert str(disk / "checkpoints") in str(full)
    assert f"{full.free} bytes free" in str(full)
    assert "the checkpoint of step 4" in str(full)
    # no half checkpoint, the one before intact
    assert [p.name for p in list_checkpoints(disk)] == ["step-000002"]
    assert [n for n in names(disk) if n.endswith(".tmp")] == []
    subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
    result = train(cfg, disk, resume=True)
    assert (result.step, result.stopped) == (4, False)
    assert [p.name for p in list_checkpoints(disk)] == ["step-000002", "step-000004"]


def test_a_write_that_fails_midway_is_storage_full_and_leaves_no_temp_folder(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An estimate that is too low (the run state in state.pt is not in it): the disk fills
    during torch.save, whose error hides the errno."""
    monkeypatch.setattr(
        core.training.checkpoint, "checkpoint_bytes", lambda *args: 0, raising=False
    )
    fill(disk, leave=300_000)
    with pytest.raises(StorageFull) as raised:
        train(small_config(steps=2, checkpoint_every=2), disk)
    assert raised.value.__cause__ is not None
    assert "No space left" in str(raised.value) or "inline_container" in str(raised.value)
    assert names(disk / "checkpoints") == []
    # the space the failed write took is free again: a later write of the same size fits
    (disk / "filler").unlink()
    monkeypatch.undo()
    assert train(small_config(steps=2, checkpoint_every=2), disk).step == 2


def test_a_stale_temp_folder_of_a_killed_run_is_removed_by_the_next_write(
    tmp_path: Path,
) -> None:
    cfg = small_config(steps=4, checkpoint_every=2)
    with small_disk(tmp_path / "disk", 2 * MIB) as disk:
        train(cfg.model_copy(update={"steps": 2}), disk)
        stale = disk / "checkpoints" / "step-000003.tmp"  # a run killed while writing it
        stale.mkdir()
        (stale / "optimizer.pt").write_bytes(b"\1" * 900_000)
        # without its removal the next checkpoint (~600 kB) does not fit
        assert train(cfg, disk, resume=True).step == 4
        assert [n for n in names(disk / "checkpoints") if "/" not in n] == [
            "step-000002",
            "step-000004",
        ]


def test_writing_removes_its_folder_and_names_a_torch_no_space_error(disk: Path) -> None:
    fill(disk, leave=64 * 1024)
    tmp = disk / "final.tmp"
    with pytest.raises(StorageFull) as raised, writing(tmp, needed=400_000):
        tmp.mkdir()
        torch.save({"w": torch.zeros(100_000)}, tmp / "model.pt")
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "inline_container" in str(raised.value.__cause__)
    assert not tmp.exists()


def test_removal_never_raises_over_the_real_error(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mount point cannot be removed (EBUSY): logged, not raised."""
    (disk / "partial").write_bytes(b"x" * 1000)
    remove_quietly(disk)
    remove_quietly(disk / "never-made")
    assert names(disk) == []
    assert f"could not remove {disk}" in caplog.text


def test_require_free_counts_the_reserve(disk: Path) -> None:
    require_free(disk, 100_000, "a test write")
    with pytest.raises(StorageFull) as raised:
        require_free(disk, 100_000, "a test write", Reserve(min_bytes=1 * MIB))
    assert raised.value.needed == 100_000 + MIB
    with pytest.raises(StorageFull):
        require_free(disk, 100_000, "a test write", Reserve(ratio=0.95))


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), StorageFull),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), StorageFull),
        (
            Exception("Error while serializing: I/O error: No space left on device (os error 28)"),
            StorageFull,
        ),
        (OSError(errno.EIO, "Input/output error", "{folder}/x"), StorageError),
        (OSError(errno.EROFS, "Read-only file system", "{folder}/x"), StorageError),
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos"), StorageError),
        (OSError(errno.ENOENT, "No such file", "/elsewhere/x"), None),
        (ValueError("a bad config"), None),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), None),
    ],
)
def test_storage_failure_tells_the_disk_from_other_errors(
    tmp_path: Path, exc: BaseException, expected: type[StorageError] | None
) -> None:
    """On a disk with room: torch's writer error with room left is an I/O error, not full."""
    if isinstance(exc, OSError) and exc.filename:
        exc.filename = exc.filename.format(folder=tmp_path)
    found = storage_failure(exc, tmp_path)
    assert type(found) is expected if expected else found is None


def test_a_final_model_that_does_not_fit_is_storage_full_and_leaves_no_folder(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final save (`core.disk.atomic_dir.write_dir_atomically`): refused up front on its
    estimate, and midway (an estimate of 0) the disk's error is StorageFull too, not the
    trainer's RuntimeError; neither leaves final/ or final.tmp."""
    cfg = small_config(steps=1, checkpoint_every=0)
    # the run's last-step checkpoint (weights and optimizer) would not fit either: skip it
    monkeypatch.setattr(core.training.run.TrainingRun, "checkpoint", lambda self: None)
    fill(disk, leave=100_000)  # the tiny model's weights take ~200 kB
    with pytest.raises(StorageFull) as raised:
        train(cfg, disk)
    assert "for final/" in str(raised.value)
    assert not {"final", "final.tmp"} & set(names(disk))
    monkeypatch.setattr(core.training.run, "_tensor_bytes", lambda tensors: 0)
    with pytest.raises(StorageFull) as raised:
        train(cfg, disk)
    assert raised.value.__cause__ is not None
    assert not {"final", "final.tmp"} & set(names(disk))
    (disk / "filler").unlink()
    assert train(cfg, disk).final_model == disk / "final"
