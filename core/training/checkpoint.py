"""Checkpoints a person can read: one folder per step with weights, optimizer, RNG and a meta.json.

    out_dir/checkpoints/step-000010/
        model.safetensors   trainable weights (LoRA: the adapters only)
        optimizer.pt        AdamW state
        (dcp/               in their place, from a sharded run: weights and AdamW state,
                            one file per rank, `torch.distributed.checkpoint`)
        state.pt            RNG states, the stale-policy snapshots (so a resume is exact)
                            and the warm-up's progress
        meta.json           step, time, config, `warmup` {done, total}: readable without torch

A run stopped during its supervised warm-up is checkpointed as step 0 with the warm-up's
optimizer in optimizer.pt (or dcp/) and meta.json's `warmup.done` below `warmup.total`; a
resumed run loads it into the warm-up's optimizer (`warmup_unfinished`) and goes on with it.

A folder is written under a temporary name and renamed when complete, so a crash mid-write never
leaves a checkpoint that looks valid. Before it starts, the disk must hold it (the previous
checkpoint's size, or the weights and optimizer state) plus the operator's reserve, else
`core.disk.storage.StorageFull` and the earlier checkpoints stay as they are; a write that fails
anyway removes its temporary folder (`core.disk.storage.writing`), as does the next write after a
crash, so a full disk never keeps a half checkpoint that fills it for the jobs after.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from core.disk.atomic_dir import discard_dir, replace_dir
from core.disk.storage import (
    StorageFull,
    checkpoint_bytes,
    remove_stale_temps,
    require_free,
    writing,
)
from core.models.base import CausalLM
from core.parallel.sharding import DCP_DIR, is_sharded, load_sharded, save_sharded

_NAME = re.compile(r"^step-(\d+)$")


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step-{step:06d}"


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints in `out_dir`, oldest first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _NAME.match(p.name)) and (p / "meta.json").is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def checkpoint_step(path: Path) -> int:
    return int(_meta(path)["step"])


def warmup_unfinished(path: Path) -> bool:
    """A checkpoint of a run stopped during its supervised warm-up (`core.training.warmup`): its
    optimizer is the warm-up's. Older checkpoints, which say nothing of it, never are."""
    warmup = _meta(path).get("warmup") or {"done": 0, "total": 0}
    return int(warmup["done"]) < int(warmup["total"])


def _meta(path: Path) -> dict[str, Any]:
    return dict(json.loads((Path(path) / "meta.json").read_text()))


def save_checkpoint(
    out_dir: Path,
    step: int,
    lm: CausalLM,
    optimizer: torch.optim.Optimizer,
    *,
    state: dict[str, Any],
    meta: dict[str, Any],
    keep: int | None = None,
) -> Path:
    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    weights = {n: p.detach().contiguous().cpu() for n, p in lm.trainable()}
    needed = _make_room(out_dir, step, list(weights.values()), optimizer)
    with writing(tmp, needed):
        tmp.mkdir(parents=True)
        save_file(weights, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        return _complete(tmp, out_dir, step, state=state, meta=meta, keep=keep)


def _make_room(
    out_dir: Path, step: int, weights: list[torch.Tensor], optimizer: torch.optim.Optimizer
) -> int:
    """Removes what an earlier write left half-done and checks that step `step`'s checkpoint
    fits (StorageFull if not); returns its estimated size."""
    root = Path(out_dir) / "checkpoints"
    remove_stale_temps(root)
    needed = checkpoint_bytes(latest_checkpoint(out_dir), weights, optimizer)
    require_free(root, needed, f"the checkpoint of step {step}")
    return needed


def _complete(
    tmp: Path,
    out_dir: Path,
    step: int,
    state: dict[str, Any],
    meta: dict[str, Any],
    keep: int | None,
) -> Path:
    """The run state and meta.json into `tmp`, then the rename that makes it the step's
    checkpoint, and the oldest beyond `keep` removed."""
    final = checkpoint_dir(out_dir, step)
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(
        json.dumps({"step": step, "saved_at": time.time(), **meta}, indent=2, default=str)
    )
    replace_dir(tmp, final)  # fsync'ed, then renamed: whole or absent (`core.disk.atomic_dir`)
    if keep is not None:
        for old in list_checkpoints(out_dir)[:-keep]:
            discard_dir(old)  # renamed away first: a download in progress keeps its files
    return final


def save_sharded_checkpoint(
    out_dir: Path,
    step: int,
    lm: CausalLM,
    optimizer: torch.optim.Optimizer,
    *,
    state: dict[str, Any],
    meta: dict[str, Any],
    keep: int | None = None,
) -> Path | None:
    """A checkpoint of a sharded run (`core.parallel.sharding`), written by every rank together:
    each its shard of the weights and optimizer state under dcp/, rank 0 the rest (and the rename
    that makes it complete, once all shards are in). Returns the folder on rank 0, None
    elsewhere."""
    import torch.distributed as dist

    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    rank = dist.get_rank()
    needed = _room_on_every_rank(out_dir, step, lm, optimizer)
    if rank != 0:
        dist.barrier()
        save_sharded(tmp, lm.module, optimizer)
        dist.barrier()  # every shard written
        return None
    with writing(tmp, needed):
        tmp.mkdir(parents=True)
        dist.barrier()
        save_sharded(tmp, lm.module, optimizer)
        dist.barrier()  # every shard written
        return _complete(tmp, out_dir, step, state=state, meta=meta, keep=keep)


def _room_on_every_rank(
    out_dir: Path, step: int, lm: CausalLM, optimizer: torch.optim.Optimizer
) -> int:
    """Every rank checks its own disk before a sharded checkpoint: rank 0 for the whole (it
    completes the folder, and on one machine every shard lands on its disk), each other rank for
    its shard. Then they agree: one refusal is every rank's StorageFull, naming the rank that
    had no room, before any of them writes. Returns rank 0's estimate (0 elsewhere)."""
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    weights: list[torch.Tensor] = [p for _, p in lm.trainable()]
    root = Path(out_dir) / "checkpoints"
    refused: StorageFull | None = None
    needed = 0
    try:
        if rank == 0:
            needed = _make_room(out_dir, step, weights, optimizer)
        else:
            share = -(-checkpoint_bytes(None, weights, optimizer) // size)  # its part, rounded up
            require_free(root, share, f"rank {rank}'s shard of the checkpoint of step {step}")
    except StorageFull as full:
        refused = full
    said: list[tuple[str, int, int] | None] = [None] * size
    mine = None if refused is None else (str(refused), refused.free, refused.needed)
    dist.all_gather_object(said, mine)
    if refused is not None:
        raise refused
    for other, why in enumerate(said):
        if why is not None:
            message, free, wanted = why
            raise StorageFull(f"rank {other} of {size}: {message}", root, free, wanted)
    return needed


def load_checkpoint(
    path: Path, lm: CausalLM, optimizer: torch.optim.Optimizer
) -> tuple[int, dict[str, Any]]:
    """Restore weights and optimizer in place; returns the step and the saved run state. A
    sharded run's checkpoint (dcp/) loads into any run; a whole one into an unsharded run."""
    path = Path(path)
    if (path / DCP_DIR).is_dir():
        load_sharded(path, lm.module, optimizer)
    elif is_sharded(lm):
        raise ValueError(
            f"{path} was written by an unsharded run; a run with sharding='fsdp' resumes "
            "only from its own (sharded) checkpoints"
        )
    else:
        lm.load_snapshot(load_file(str(path / "model.safetensors"), device=str(lm.device)))
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=lm.device))
    state = torch.load(path / "state.pt", map_location="cpu")
    return checkpoint_step(path), state
