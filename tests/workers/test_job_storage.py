"""What a job reports for an error of its disk (`workers.job.storage`): the failure code a job
ends with for each kind of error, and the size it must find free before it starts."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from core.budget import model_shape
from core.disk.storage import StorageError, StorageFull
from tests.support.trainer_runs import small_config
from workers.job.exits import error_code
from workers.job.storage import as_storage_error, first_write_bytes


def _code(exc: BaseException, folder: Path) -> str:
    return error_code(as_storage_error(exc, folder) or exc)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "{job}/metrics.jsonl"), "storage_full"),
        (OSError(errno.EDQUOT, "Disk quota exceeded", "{job}/final/config.json"), "storage_full"),
        (StorageFull("full", Path("/x"), 1, 2), "storage_full"),
        (OSError(errno.EIO, "Input/output error", "{job}/eval.jsonl"), "storage_error"),
        (StorageError("bad", Path("/x")), "storage_error"),
        # torch's writer with room left on the disk: an I/O error, not a full disk
        (
            RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos"),
            "storage_error",
        ),
        (OSError(errno.ENOENT, "No such file", "/data/prompts.jsonl"), "training_error"),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), "training_error"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory"), "out_of_memory"),
        (MemoryError(), "out_of_memory"),
    ],
)
def test_the_failure_code_of_each_error(tmp_path: Path, exc: BaseException, code: str) -> None:
    if isinstance(exc, OSError) and exc.filename:
        exc.filename = exc.filename.format(job=tmp_path)
    assert _code(exc, tmp_path) == code


def test_the_storage_error_keeps_the_original_as_its_cause(tmp_path: Path) -> None:
    original = OSError(errno.ENOSPC, "No space left on device")
    shown = as_storage_error(original, tmp_path)
    assert isinstance(shown, StorageFull) and shown.__cause__ is original
    assert str(shown).startswith(f"no space left in {tmp_path} (")
    assert str(shown).endswith(
        "OSError: [Errno 28] No space left on device; free some space, then resume the job"
    )


def test_a_full_disk_elsewhere_is_named_as_it_is(tmp_path: Path) -> None:
    original = OSError(errno.ENOSPC, "No space left on device", "/var/cache/x/model.bin")
    shown = as_storage_error(original, tmp_path)
    assert isinstance(shown, StorageFull)
    assert str(shown).startswith("no space left in /var/cache/x (")


def test_a_fresh_job_needs_its_weights_and_two_adam_moments(tmp_path: Path) -> None:
    cfg = small_config()
    trainable = model_shape(cfg).trainable
    assert trainable is not None and trainable > 0
    assert first_write_bytes(cfg, tmp_path, [], None) == trainable * 4 * 3


def test_a_resumed_job_needs_the_size_of_its_latest_checkpoint(tmp_path: Path) -> None:
    for step, size in ((2, 1000), (4, 3000)):
        folder = tmp_path / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text("{}")
        (folder / "optimizer.pt").write_bytes(b"\0" * size)
    assert first_write_bytes(small_config(), tmp_path, [], None) == 3002
