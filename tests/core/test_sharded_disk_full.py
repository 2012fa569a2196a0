"""A sharded (FSDP) checkpoint when one rank's disk is full: every rank checks its own disk for
what it writes, and the ranks decide together, so all of them refuse before any writes
(`core.training.checkpoint._room_on_every_rank`): StorageFull everywhere, naming the rank that
had no room, no temporary folder, the earlier checkpoint as it was. This is the job's documented
disk-full behaviour (`storage_full`, resumable), on every rank.

Only rank 0 checked before: with rank 1's disk full, rank 0 began writing, rank 1's write failed
mid-way, and rank 0 then failed in a collective with gloo's error, not the disk's.

Rank 1's own disk is a tmpfs in a mount namespace of its own (`tests.core.sharded_disk_rank`):
mounting needs root, as CI has (`tests.support.small_disk`); elsewhere the test is skipped,
saying so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import REPO


def run_ranks(tmp_path: Path, full: int) -> dict[int, dict[str, object]]:
    out = tmp_path / "out"
    out.mkdir()
    init = f"file://{tmp_path / 'rendezvous'}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "tests.core.sharded_disk_rank", str(rank), init]
        command += [str(out), str(full)]
        if rank == full:
            command = ["unshare", "--mount", "--propagation", "private", *command]
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE))
    errors = [proc.communicate(timeout=240)[1].decode(errors="replace") for proc in procs]
    if any("unshare failed" in e or "mount: " in e for e in errors):
        pytest.skip(f"cannot give a rank a disk of its own here (needs root): {errors}")
    assert [proc.returncode for proc in procs] == [0, 0], errors
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)}


def test_a_rank_whose_disk_is_full_refuses_the_checkpoint_on_every_rank(tmp_path: Path) -> None:
    seen = run_ranks(tmp_path, full=1)
    said0, said1 = str(seen[0]["said"]), str(seen[1]["said"])
    assert said1.startswith("StorageFull: not enough free space in "), said1
    assert "for rank 1's shard of the checkpoint of step 2: " in said1, said1
    assert said0.startswith("StorageFull: rank 1 of 2: not enough free space in "), said0
    # nothing written, nothing half-written, on either disk; the first checkpoint as it was
    assert seen[1]["seen"] == [], seen[1]
    listing = [n for n in seen[0]["seen"] if isinstance(n, str)]
    assert [n for n in listing if n.count("/") == 0] == ["step-000001"], listing
    assert "step-000001/meta.json" in listing


def test_with_room_on_every_disk_every_rank_writes_its_shard(tmp_path: Path) -> None:
    """The agreement costs nothing when there is room (no rank is given a full disk)."""
    seen = run_ranks(tmp_path, full=-1)
    assert (seen[0]["said"], seen[1]["said"]) == ("written", "written")
    tops = [n for n in seen[0]["seen"] if isinstance(n, str) and n.count("/") == 0]
    assert tops == ["step-000001", "step-000002"]
