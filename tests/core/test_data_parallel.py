"""A data-parallel update (`core.distributed`, `core.update`) on CPU with gloo, world size 2:
each rank trains on half of a rollout batch (whole groups), and the replicas end with the
parameters and metrics of one process's update on the whole batch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.config import TrainConfig
from core.distributed import World
from core.models import load_model
from core.rollout import RolloutBatch, generate
from core.trainer import build_optimizer
from core.update import group_advantages, update_policy

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


def step(cfg: TrainConfig, world: World) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    lm, batch, adv = rollout(cfg)
    rows = torch.arange(len(adv))[world.share(len(adv))]  # whole groups: 2 of the 4
    optimizer = build_optimizer([p for _, p in lm.trainable()], cfg.optim, lm.device)
    metrics = update_policy(
        lm,
        optimizer,
        batch.select(rows),
        adv[rows],
        cfg,
        shuffle_gen=torch.Generator().manual_seed(1),
        reference=None,
        should_stop=lambda: False,
        before_step=lambda: None,
        world=world,
    )
    return {n: p.detach().clone() for n, p in lm.trainable()}, metrics


def _rank(rank: int, size: int, init: str, cfg_json: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        result = step(TrainConfig.model_validate_json(cfg_json), World(rank, size))
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def data_parallel(cfg: TrainConfig, tmp_path: Path, size: int = 2) -> list[Any]:
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_rank, args=(size, init, cfg.model_dump_json(), str(tmp_path)), nprocs=size)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(size)]


@pytest.mark.parametrize(
    "algorithm",
    [
        {},
        {"loss_agg": "seq_mean"},
        {"loss_agg": "minibatch_token_mean", "mask": "dppo"},
    ],
    ids=["token_mean", "seq_mean", "minibatch_token_mean"],
)
def test_two_ranks_take_the_single_process_step(tmp_path: Path, algorithm: dict[str, Any]) -> None:
    cfg = config(**algorithm)
    want_params, want_metrics = step(cfg, World())
    (params0, metrics0), (params1, metrics1) = data_parallel(cfg, tmp_path)
    start, _, _ = rollout(cfg)
    moved = 0
    for name, want in want_params.items():
        # replicas agree exactly: they sum the same gradients and take the same step
        assert torch.equal(params0[name], params1[name]), name
        torch.testing.assert_close(params0[name], want, rtol=1e-5, atol=1e-6)
        moved += int(not torch.equal(want, dict(start.trainable())[name].detach()))
    assert moved == len(want_params)  # every weight took part in the compared step
    assert metrics0 == metrics1  # global metrics, the same on every rank
    for name, value in want_metrics.items():
        assert metrics0[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name
    assert 0 < want_metrics["masked_fraction"] < 1


def test_a_rank_alone_is_not_the_whole_batch(tmp_path: Path) -> None:
    """The check above can fail: a rank that kept its own gradient (no sum over the ranks)
    takes a different step from the whole batch's."""
    cfg = config()
    want_params, _ = step(cfg, World())
    lm, batch, adv = rollout(cfg)
    half = torch.arange(len(adv))[: len(adv) // 2]
    optimizer = build_optimizer([p for _, p in lm.trainable()], cfg.optim, lm.device)
    update_policy(
        lm,
        optimizer,
        batch.select(half),
        adv[half],
        cfg,
        shuffle_gen=torch.Generator().manual_seed(1),
        reference=None,
        should_stop=lambda: False,
        before_step=lambda: None,
    )
    differs = [
        n for n, p in lm.trainable() if not torch.allclose(p.detach(), want_params[n], rtol=1e-5)
    ]
    assert differs
