"""The data-parallel tests' runs: one update step on one process or on several gloo ranks,
and `pdppo train` on one or two processes (tests/core/test_data_parallel.py, test_sharding.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from torch.distributed.fsdp import FSDPModule

from core.config import TrainConfig
from core.models import load_model
from core.parallel.distributed import World
from core.parallel.sharding import shard
from core.rollout import RolloutBatch, generate
from core.training.trainer import build_optimizer
from core.training.update import group_advantages, update_policy
from tests.support.stack import pdppo_command
from tests.support.trainer_runs import read_metrics, small_config

GROUPS, GROUP_SIZE = 4, 4


def config(**algorithm: Any) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}},
            "task": {"name": "reverse", "min_len": 2, "max_len": 3},
            "rollout": {"prompts_per_step": GROUPS, "group_size": GROUP_SIZE},
            "algorithm": {"top_k": 8, "delta_low": 0.02, "delta_high": 0.02, **algorithm},
            # AdamW's first step divides by |g| + eps: 1e-6 keeps the comparison to the gradient
            "optim": {"lr": 1e-2, "eps": 1e-6},
            "device": "cpu",
        }
    )


def rollout(cfg: TrainConfig) -> tuple[Any, RolloutBatch, torch.Tensor]:
    """The same model, batch and advantages in every process: seeded, sampled before the
    weights move a little (so the mask has something to do), responses of unequal lengths."""
    torch.manual_seed(0)
    lm = load_model(cfg.model, torch.device("cpu"))
    projection = lm.output_projection()
    assert projection is not None
    with torch.no_grad():
        projection[0].mul_(10.0)  # peaked distributions: divergences the mask acts on
    tok = lm.tokenizer
    prompts = [tok.encode_prompt(p) for p in ("12", "345", "67", "8901") for _ in range(4)]
    batch = generate(
        lm, prompts, max_new_tokens=6, temperature=1.0, top_k=8, generator=torch.manual_seed(3)
    )
    with torch.no_grad():
        for _, p in lm.trainable():
            p.add_(torch.randn_like(p) * float(p.std()))
    rewards = torch.linspace(0.0, 1.0, len(prompts)).roll(5)  # unequal group means
    return lm, batch, group_advantages(rewards, GROUP_SIZE, normalize_std=False)


def step(
    cfg: TrainConfig, world: World, rows: slice | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One update on the world's share of the batch (whole groups: 2 of the 4 for a rank of
    two), or on the `rows` given."""
    lm, batch, adv = rollout(cfg)
    picked = torch.arange(len(adv))[rows or world.share(len(adv))]
    if world.parallel and cfg.sharding == "fsdp":
        shard(lm)  # after the rollout: every rank starts from the same whole model
        # each block is gathered alone (one group for the whole model would gather it whole)
        assert all(isinstance(b, FSDPModule) for b in lm.blocks())
    optimizer = build_optimizer([p for _, p in lm.trainable()], cfg.optim, lm.device)
    metrics = update_policy(
        lm,
        optimizer,
        batch.select(picked),
        adv[picked],
        cfg,
        shuffle_gen=torch.Generator().manual_seed(1),
        reference=None,
        should_stop=lambda: False,
        before_step=lambda: None,
        world=world,
    )
    return {n: _whole(p) for n, p in lm.trainable()}, metrics


def _whole(p: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value (a sharded one is gathered: every rank calls this)."""
    full = getattr(p, "full_tensor", None)
    return (full() if full is not None else p).detach().clone()


def _rank(rank: int, size: int, init: str, cfg_json: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        result = step(TrainConfig.model_validate_json(cfg_json), World(rank, size))
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears the group down under another (gloo aborts: SIGABRT)
    finally:
        dist.destroy_process_group()


def data_parallel(cfg: TrainConfig, tmp_path: Path, size: int = 2) -> list[Any]:
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_rank, args=(size, init, cfg.model_dump_json(), str(tmp_path)), nprocs=size)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(size)]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`pdppo train` in a process of its own (it spawns the ranks)."""
    return subprocess.run(
        [*pdppo_command(), "train", *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def spec_file(path: Path, steps: int, gpus: int = 1, sharding: str = "replicate") -> Path:
    cfg = small_config(steps=steps, checkpoint_every=2, sharding=sharding)
    spec = {"name": "dp", "resources": {"gpus": gpus}, "train": cfg.model_dump(mode="json")}
    path.write_text(yaml.safe_dump(spec))
    return path


def resume_on_two_and_one(out: Path, longer: Path) -> Path:
    """A copy of the 2-step run `out` (the copy returned) and `out` itself resumed to step 4 from
    their step-2 checkpoint, the copy on one process and `out` on two."""
    alone = out.with_name(out.name + "-alone")
    shutil.copytree(out, alone)
    for target, nproc in ((out, "2"), (alone, "1")):
        resumed = run_cli(str(longer), "--out", str(target), "--resume", "--nproc", nproc)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
        assert [r["step"] for r in read_metrics(target)] == [1.0, 2.0, 3.0, 4.0]
    return alone
