"""One rank of a sharded (FSDP) checkpoint whose rank `full` has a full disk, for
tests/core/test_sharded_disk_full.py: `python -m tests.core.sharded_disk_rank RANK INIT OUT FULL`.

Every rank writes its shard under the same folder, and on one machine that folder is on one
disk; a rank of its own disk is a rank on another machine, or in a container of its own. The
test starts rank FULL in a mount namespace of its own (`unshare -m`), where this script mounts a
small tmpfs over the checkpoints folder and fills it after the first checkpoint: only that rank
sees a full disk. What each rank's second checkpoint did goes to OUT/rank<RANK>.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from core.disk.storage import StorageFull
from core.models import load_model
from core.parallel.sharding import shard
from core.training.checkpoint import save_sharded_checkpoint
from core.training.trainer import build_optimizer
from tests.support.small_disk import fill, names
from tests.support.trainer_runs import small_config

DISK = 256 * 1024  # the full rank's disk: room for its shard of the first checkpoint, not more


def main(rank: int, init: str, out: Path, full: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    try:
        torch.manual_seed(0)
        cfg = small_config(sharding="fsdp")
        lm = load_model(cfg.model, torch.device("cpu"))
        shard(lm)
        optimizer = build_optimizer([p for _, p in lm.trainable()], cfg.optim, lm.device)
        save_sharded_checkpoint(out, 1, lm, optimizer, state={"step": 1}, meta={})
        checkpoints = out / "checkpoints"
        if rank == full:  # its own disk, full: seen by this rank only
            private = ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(checkpoints)]
            subprocess.run(private, check=True, timeout=30)
            fill(checkpoints, leave=4096)
        dist.barrier()
        try:
            save_sharded_checkpoint(out, 2, lm, optimizer, state={"step": 2}, meta={})
            said = "written"
        except StorageFull as exc:
            said = f"StorageFull: {exc}"
        except Exception as exc:  # what the write did instead: the test shows it
            said = f"{type(exc).__name__}: {exc}"
        seen = [n for n in names(checkpoints) if n != "filler"]
        (out / f"rank{rank}.json").write_text(json.dumps({"said": said, "seen": seen}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
