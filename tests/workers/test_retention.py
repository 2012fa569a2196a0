"""The retention pass (`workers.upkeep.retention`) on a real Redis and real folders: with a job of
every status, old and recent, exactly which files go and which stay; final models kept or not; the
folders of deletes whose deleter died; folders that are not this store's jobs left alone."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import redis

from pdppo.store import JobStore, job_key
from pdppo.store.keys import PURGE_SET, lease_key
from tests.support.seed import seed_job
from workers.upkeep.retention import PURGE_GRACE_SECONDS, retention_once

NOW = time.mktime((2026, 12, 1, 0, 0, 0, 0, 0, 0))
OLD = "2026-10-01T00:00:00.000Z"  # 61 days before NOW
RECENT = "2026-11-25T00:00:00.000Z"  # 6 days before
STATUSES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")
EVERYTHING = ["checkpoints", "final", "inputs", "train.log"]


def job_id(n: int) -> str:
    return f"{n:024x}"


def make_folder(root: Path, name: str, upload: Path) -> None:
    """What a job leaves: two checkpoints, a final model, its link to an upload, a log."""
    folder = root / name
    for step in ("step-000002", "step-000004"):
        (folder / "checkpoints" / step).mkdir(parents=True)
        (folder / "checkpoints" / step / "model.safetensors").write_bytes(b"w" * 10)
    (folder / "final").mkdir()
    (folder / "final" / "model.safetensors").write_bytes(b"f" * 10)
    (folder / "final" / "config.json").write_text("{}")
    (folder / "inputs").mkdir()
    os.link(upload, folder / "inputs" / "file-x.jsonl")
    (folder / "train.log").write_text("log\n")


def contents(root: Path, name: str) -> list[str]:
    folder = root / name
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def upload(tmp_path: Path) -> Path:
    path = tmp_path / "artifacts" / "files" / "alice" / "abc.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"prompt": "1", "answer": "1"}\n')
    return path


@pytest.mark.parametrize("keep_final", [True, False])
def test_a_pass_expires_only_old_ended_jobs(
    client: redis.Redis, tmp_path: Path, upload: Path, keep_final: bool
) -> None:
    root = tmp_path / "artifacts"
    ids: dict[tuple[str, str], str] = {}
    for n, (status, ended) in enumerate(
        [(s, age) for s in STATUSES for age in (OLD, RECENT)], start=1
    ):
        ids[status, ended] = job_id(n)
        seed_job(client, job_id(n), status, finished_at=ended)
        if status in ("queued", "running", "paused"):  # long in progress: never expired
            client.hset(job_key(job_id(n)), mapping={"created_at": OLD, "updated_at": OLD})
        make_folder(root, job_id(n), upload)
    leased = job_id(99)  # old and succeeded, but its worker has not let go of it yet
    seed_job(client, leased, "succeeded", finished_at=OLD)
    client.set(lease_key(leased), "worker-1:token")
    make_folder(root, leased, upload)
    stranger = job_id(100)  # a job folder with no record here: another store's, not ours
    make_folder(root, stranger, upload)
    (root / "notes").mkdir()
    partial = job_id(101)  # a hash some stray write left with no job in it
    client.hset(job_key(partial), "checkpoint_step", "4")
    make_folder(root, partial, upload)

    report = retention_once(JobStore(client), root, days=30, keep_final=keep_final, now=NOW)

    old_ended = {ids[s, OLD] for s in ("succeeded", "failed", "cancelled")}
    assert set(report.expired) == old_ended
    for (status, ended), name in ids.items():
        if name not in old_ended:
            assert contents(root, name) == EVERYTHING, (status, ended)
            assert client.hget(job_key(name), "artifacts_expired_at") is None
            continue
        kept = ["final"] if keep_final and status == "succeeded" else []
        assert contents(root, name) == kept, status
        assert report.expired[name] == [n for n in EVERYTHING if n not in kept]
        # the record and its history stay, marked
        assert client.hget(job_key(name), "status") == status
        assert client.hget(job_key(name), "artifacts_expired_at") is not None
    if keep_final:
        assert (root / ids["succeeded", OLD] / "final" / "config.json").read_text() == "{}"
    for untouched in (leased, stranger, partial):
        assert contents(root, untouched) == EVERYTHING
    assert (root / "notes").is_dir()
    assert upload.read_bytes() == b'{"prompt": "1", "answer": "1"}\n'  # links gone, not the file
    assert os.stat(upload).st_nlink == 1 + 15 - len(old_ended)  # 15 folders linked it

    again = retention_once(JobStore(client), root, days=30, keep_final=keep_final, now=NOW)
    assert again.expired == {} and again.purged == []


def test_days_zero_keeps_everything(client: redis.Redis, tmp_path: Path, upload: Path) -> None:
    root = tmp_path / "artifacts"
    seed_job(client, job_id(1), "failed", finished_at="2000-01-01T00:00:00.000Z")
    make_folder(root, job_id(1), upload)
    report = retention_once(JobStore(client), root, days=0, keep_final=False, now=NOW)
    assert (report.expired, report.purged) == ({}, [])
    assert contents(root, job_id(1)) == EVERYTHING


def test_a_pass_removes_the_folders_of_deletes_whose_deleter_died(
    client: redis.Redis, tmp_path: Path, upload: Path
) -> None:
    root = tmp_path / "artifacts"
    for n in (1, 2):
        make_folder(root, job_id(n), upload)
    client.zadd(PURGE_SET, {job_id(1): NOW - PURGE_GRACE_SECONDS - 1, job_id(2): NOW - 1})
    client.zadd(PURGE_SET, {job_id(3): NOW - 3600})  # its folder is gone already

    report = retention_once(JobStore(client), root, days=0, keep_final=True, now=NOW)

    assert report.purged == [job_id(3), job_id(1)]
    assert not (root / job_id(1)).exists()
    assert contents(root, job_id(2)) == EVERYTHING  # a delete that may be in progress
    assert client.zrange(PURGE_SET, 0, -1) == [job_id(2)]
