"""Checkpoints a person can read: one folder per step with weights, optimizer, RNG and a meta.json.

    out_dir/checkpoints/step-000010/
        model.safetensors   trainable weights (LoRA: the adapters only)
        optimizer.pt        AdamW state
        state.pt            RNG states and the stale-policy snapshots (so a resume is exact)
        meta.json           step, time, config: readable without torch

A folder is written under a temporary name and renamed when complete, so a crash mid-write never
leaves a checkpoint that looks valid.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from core.models.base import CausalLM

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
    return int(json.loads((Path(path) / "meta.json").read_text())["step"])


def save_checkpoint(
    out_dir: Path,
    step: int,
    lm: CausalLM,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    meta: dict[str, Any],
    keep: int | None = None,
) -> Path:
    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {n: p.detach().contiguous().cpu() for n, p in lm.trainable()}
    save_file(weights, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(
        json.dumps({"step": step, "saved_at": time.time(), **meta}, indent=2, default=str)
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if keep is not None:
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    path: Path, lm: CausalLM, optimizer: torch.optim.Optimizer
) -> tuple[int, dict[str, Any]]:
    """Restore weights and optimizer in place; returns the step and the saved run state."""
    path = Path(path)
    lm.load_snapshot(load_file(str(path / "model.safetensors"), device=str(lm.device)))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=lm.device))
    state = torch.load(path / "state.pt", map_location="cpu")
    return checkpoint_step(path), state
