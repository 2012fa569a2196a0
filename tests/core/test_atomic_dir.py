"""A final model and a checkpoint appear whole or not at all (`core.disk.atomic_dir`).

The kill tests run the trainer in a child process that SIGKILLs itself in the middle of the
save, after the first file is written: what a worker killed during the final save leaves. The
API then finds no `final/` (before, it found one with model.safetensors and no config.json, and
served it)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest
import torch

from core.disk.atomic_dir import discard_dir, replace_dir, write_dir_atomically
from core.disk.storage import StorageFull
from core.models.tiny import TinyLM
from core.training.checkpoint import list_checkpoints, save_checkpoint
from core.training.trainer import train
from tests.support.trainer_runs import small_config


def _killed_during_final_save(out: str) -> None:
    """The trainer, whose final save dies by SIGKILL between its two files."""
    from core.models import tiny

    def dies_halfway(self: TinyLM, path: Path, **kwargs: object) -> None:
        path.mkdir(parents=True, exist_ok=True)
        tiny.save_model(self.module, str(path / "model.safetensors"))
        os.kill(os.getpid(), signal.SIGKILL)

    tiny.TinyLM.save_final = dies_halfway  # type: ignore[method-assign]
    torch.set_num_threads(1)
    train(small_config(steps=1, checkpoint_every=1), Path(out))


def test_a_run_killed_during_the_final_save_leaves_no_final_model(tmp_path: Path) -> None:
    proc = multiprocessing.get_context("spawn").Process(
        target=_killed_during_final_save, args=(str(tmp_path),)
    )
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    assert (tmp_path / "checkpoints" / "step-000001" / "meta.json").is_file()
    assert not (tmp_path / "final").exists()
    # the half-written temporary folder is all there is, and the next save removes it
    assert sorted(p.name for p in tmp_path.glob("final*")) == ["final.tmp"]
    assert [p.name for p in (tmp_path / "final.tmp").iterdir()] == ["model.safetensors"]


def test_a_completed_run_has_a_whole_final_model_and_no_temporary_folder(tmp_path: Path) -> None:
    (tmp_path / "final.tmp").mkdir()  # a killed earlier attempt's
    (tmp_path / "final.tmp" / "model.safetensors").write_bytes(b"half")
    torch.set_num_threads(1)
    result = train(small_config(steps=1, checkpoint_every=1), tmp_path)
    assert result.final_model == tmp_path / "final"
    assert sorted(p.name for p in (tmp_path / "final").iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("final", "."))) == [
        "final"
    ]


def test_a_write_that_raises_leaves_the_old_folder_and_no_temporary_one(tmp_path: Path) -> None:
    final = tmp_path / "final"
    write_dir_atomically(final, lambda d: (d / "a.txt").write_text("old"))

    def fails(folder: Path) -> None:
        (folder / "a.txt").write_text("new, half")
        raise OSError(28, "No space left on device")

    with pytest.raises(StorageFull, match="No space left"):  # the disk's, named (core.disk.storage)
        write_dir_atomically(final, fails)
    assert (final / "a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_replacing_a_folder_leaves_only_the_new_one(tmp_path: Path) -> None:
    final = tmp_path / "final"
    write_dir_atomically(final, lambda d: (d / "old.txt").write_text("1"))
    write_dir_atomically(final, lambda d: (d / "new.txt").write_text("2"))
    assert [p.name for p in final.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_replace_dir_fsyncs_every_file_and_folder_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / "x.tmp"
    (tmp / "sub").mkdir(parents=True)
    (tmp / "a").write_text("a")
    (tmp / "sub" / "b").write_text("b")
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    replace_dir(tmp, tmp_path / "x")
    # the contents under their temporary names, then the parent that holds the rename
    assert sorted(synced[:-1]) == sorted(
        [str(tmp / "a"), str(tmp / "sub" / "b"), str(tmp / "sub"), str(tmp)]
    )
    assert synced[-1] == str(tmp_path)


def test_discard_dir_renames_away_before_removing_and_ignores_a_missing_folder(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "step-000002"
    folder.mkdir()
    held = (folder / "weights").open("wb")  # a reader that opened it before
    held.write(b"w")
    held.flush()
    discard_dir(folder)
    discard_dir(folder)  # gone: nothing to do, no error
    assert list(tmp_path.iterdir()) == []
    held.close()


@pytest.mark.parametrize(
    ("before", "step", "after"),
    [
        ([], 2, ["step-000002"]),  # first one
        (["step-000002"], 4, ["step-000002", "step-000004"]),  # added beside
        (["step-000002", "step-000004"], 6, ["step-000004", "step-000006"]),  # keep=2 rotates
        (["step-000002", "step-000004"], 4, ["step-000002", "step-000004"]),  # same step again
    ],
)
def test_checkpoints_are_whole_after_every_save(
    tmp_path: Path, before: list[str], step: int, after: list[str]
) -> None:
    """Checkpoints (already atomic before this change) stay so: no temporary or discarded
    folder is left, each one listed has every file."""
    lm = TinyLM(small_config().model.tiny)
    opt = torch.optim.AdamW([p for _, p in lm.trainable()])
    for name in before:
        save_checkpoint(tmp_path, int(name[5:]), lm, opt, state={}, meta={}, keep=2)
    save_checkpoint(tmp_path, step, lm, opt, state={}, meta={}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == after
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == after
    for path in list_checkpoints(tmp_path):
        assert sorted(p.name for p in path.iterdir()) == [
            "meta.json",
            "model.safetensors",
            "optimizer.pt",
            "state.pt",
        ]
