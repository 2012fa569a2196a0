"""A data-parallel update (`core.parallel.distributed`, `core.training.update`) on CPU with gloo,
world size 2: each rank trains on half of a rollout batch (whole groups), and the replicas end with
the parameters and metrics of one process's update on the whole batch."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from safetensors.torch import load_file

from core.config import TrainConfig
from core.parallel.distributed import World
from core.training.callbacks import TrainerCallback
from core.training.checkpoint import list_checkpoints
from core.training.run import TrainingRun as _Run
from core.training.trainer import train
from tests.core.data_parallel_runs import (
    GROUP_SIZE,
    GROUPS,
    config,
    data_parallel,
    resume_on_two_and_one,
    rollout,
    run_cli,
    spec_file,
    step,
)
from tests.support.stack import children, pdppo_command, running, still_running
from tests.support.trainer_runs import SpreadReward, read_metrics, small_config, strip_timing


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
        # AdamW's first step moves a weight by lr * g / (|g| + eps): where |g| is near eps, the
        # two processes' other summation order (a 1e-3 relative change of a near-zero gradient)
        # moves it by up to lr * 1e-3 / 4 = 2.5e-6 (1.1e-6 measured on an AVX-512 machine). A
        # gradient off by a factor of 2 moves such weights by lr / 6, and those with |g| = 100 eps
        # by 5e-5: far past this tolerance of 1e-3 of the step.
        torch.testing.assert_close(params0[name], want, rtol=1e-5, atol=1e-5)
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
    alone, _ = step(cfg, World(), rows=slice(0, GROUPS * GROUP_SIZE // 2))  # rank 0's half
    differs = [n for n, p in alone.items() if not torch.allclose(p, want_params[n], rtol=1e-5)]
    assert differs


def test_pdppo_train_with_two_processes_writes_one_run_that_resumes_on_one_or_two(
    tmp_path: Path,
) -> None:
    out = tmp_path / "two"
    # a spec of 2 devices runs as 2 processes (resources.gpus), as --nproc 2 does below
    done = run_cli(str(spec_file(tmp_path / "two.yaml", 2, gpus=2)), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training on 2 processes" in done.stdout
    rows = read_metrics(out)  # rank 0 alone writes: one line per step
    assert [r["step"] for r in rows] == [1.0, 2.0]
    assert all(math.isfinite(v) for r in rows for v in r.values())
    assert [p.name for p in list_checkpoints(out)] == ["step-000002"]
    assert (out / "final" / "model.safetensors").is_file()
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoints", "eval.jsonl", "final", "metrics.jsonl", "samples.jsonl"
    ]  # fmt: skip

    alone = resume_on_two_and_one(out, spec_file(tmp_path / "four.yaml", 4))
    for target in (out, alone):
        assert [p.name for p in list_checkpoints(target)] == ["step-000002", "step-000004"]
    # the steps before the resume are the two-process run's, whichever resumed it
    assert read_metrics(out)[:2] == read_metrics(alone)[:2] == rows


def test_a_batch_that_does_not_split_over_the_processes_is_refused(tmp_path: Path) -> None:
    failed = run_cli(str(spec_file(tmp_path / "s.yaml", 2)), "--out", str(tmp_path), "--nproc", "3")
    assert failed.returncode != 0
    assert "rollout.prompts_per_step=4 must split evenly over 3 processes" in failed.stderr


def test_each_rank_draws_the_steps_prompts_and_keeps_its_share_of_whole_groups(
    tmp_path: Path,
) -> None:
    """No collective is needed to sample: rank r's rollout is the r-th half of the groups one
    process would draw, each prompt repeated group_size times."""
    cfg = small_config(steps=1)
    runs = [_Run(cfg, tmp_path / str(r), TrainerCallback(), world=World(r, 2)) for r in (0, 1)]
    single = _Run(cfg, tmp_path / "single", TrainerCallback())
    drawn = [e.prompt for e in single.rollout().examples]
    shares = [[e.prompt for e in run.rollout().examples] for run in runs]
    assert shares[0] + shares[1] == drawn and len(shares[0]) == len(drawn) // 2
    group = cfg.rollout.group_size
    assert all(len(set(share[i : i + group])) == 1 for share in shares for i in (0, group))


def _step_rank(rank: int, size: int, init: str, cfg_json: str, out: str) -> None:
    import core.training.run

    # rewards that vary within groups (a fresh process: patch here)
    real = core.training.run.make_task
    core.training.run.make_task = lambda *a, **kw: SpreadReward(real(*a, **kw))  # type: ignore[assignment]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        run = _Run(
            TrainConfig.model_validate_json(cfg_json),
            Path(out) / f"r{rank}",
            TrainerCallback(),
            world=World(rank, size),
        )
        metrics = run.run_step()
        assert run.last_rollout is not None
        torch.save((metrics, run.last_rollout.rewards), os.path.join(out, f"step{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_steps_metrics_are_the_whole_batchs_on_every_rank(tmp_path: Path) -> None:
    cfg = small_config(steps=1)
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_step_rank, args=(2, init, cfg.model_dump_json(), str(tmp_path)), nprocs=2)
    (m0, rewards0), (m1, rewards1) = (torch.load(tmp_path / f"step{r}.pt") for r in (0, 1))
    rewards = torch.tensor(rewards0 + rewards1)
    assert len(rewards) == cfg.rollout.prompts_per_step * cfg.rollout.group_size
    assert rewards0 != rewards1 and rewards.std() > 0
    timing = {"rollout_time", "update_time", "step_time", "tokens_per_s"}
    assert {k: v for k, v in m0.items() if k not in timing} == {
        k: v for k, v in m1.items() if k not in timing
    }
    assert m0["reward_mean"] == pytest.approx(float(rewards.mean()), rel=1e-9)
    assert m0["reward_std"] == pytest.approx(float(rewards.std()), rel=1e-6)


def spawned(pid: int) -> list[int]:
    """The ranks `pdppo train` (process `pid`) started: its multiprocessing spawn children."""
    out = []
    for child in children(pid):
        try:
            if "spawn" in Path(f"/proc/{child}/cmdline").read_text():
                out.append(child)
        except OSError:
            continue  # gone meanwhile
    return out


def test_a_rank_killed_with_9_fails_the_run_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*pdppo_command(), "train", str(spec_file(tmp_path / "s.yaml", 5000)), "--out",
         str(out), "--nproc", "2", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        metrics = out / "metrics.jsonl"
        while not metrics.exists() or len(read_metrics(out)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        ranks = spawned(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGKILL)
        code = proc.wait(timeout=60)
        _, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code != 0 and "Error" in err and "SIGKILL" in err, err[-2000:]
    assert not any(running(p) for p in ranks)  # the other rank was stopped too


def test_ranks_die_with_a_pdppo_train_killed_with_9(tmp_path: Path) -> None:
    """Every rank gets SIGKILL when its `pdppo train` dies, whatever killed it (torch's spawn
    arms SIGINT, which a rank blocked in a collective never acts on: the fresh-clone CI of
    a81de89 saw both ranks outlive it)."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*pdppo_command(), "train", str(spec_file(tmp_path / "s.yaml", 5000)), "--out",
         str(out), "--nproc", "2", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        metrics = out / "metrics.jsonl"
        while not metrics.exists() or len(read_metrics(out)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        ranks = spawned(proc.pid)
        assert len(ranks) == 2, ranks
    finally:
        proc.kill()
        proc.wait()
    assert still_running(ranks, 10) == []


class StopOnSecondAsk(TrainerCallback):
    """Rank 0's: a stop asked during the warm-up (the other ranks' callbacks never ask)."""

    def __init__(self) -> None:
        self.asked = 0

    def should_stop(self) -> bool:
        self.asked += 1
        return self.asked >= 2


def _warmup_stop_rank(
    rank: int,
    size: int,
    init: str,
    cfg_json: str,
    out: str,
    run: str = "run",
    stop: bool = True,
    resume: bool = False,
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        cb = StopOnSecondAsk() if rank == 0 and stop else TrainerCallback()
        cfg = TrainConfig.model_validate_json(cfg_json)
        result = train(cfg, Path(out) / run, callback=cb, resume=resume, world=World(rank, size))
        torch.save((result.step, result.stopped), os.path.join(out, f"stop{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)  # what the bug does: the ranks wait on each other forever
@pytest.mark.parametrize("sharding", ["replicate", "fsdp"])
def test_a_stop_during_the_warm_up_stops_every_rank_at_the_same_step(
    tmp_path: Path, sharding: str
) -> None:
    """Rank 0 alone hears the stop; had it left the warm-up alone, the others would go on to the
    RL steps and wait there for it (sharded: in the warm-up's own collectives) forever."""
    cfg = small_config(task={"warmup_steps": 50}, sharding=sharding)
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_warmup_stop_rank, args=(2, init, cfg.model_dump_json(), str(tmp_path)), nprocs=2)
    assert [torch.load(tmp_path / f"stop{r}.pt") for r in range(2)] == [(0, True), (0, True)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sharding", ["replicate", "fsdp"])
def test_a_warm_up_stopped_on_two_ranks_resumes_where_it_stopped(
    tmp_path: Path, sharding: str
) -> None:
    """The stop agreed during the warm-up is checkpointed (sharded: each rank its shard of the
    warm-up's optimizer), and the two ranks resumed from it end where two uninterrupted ranks
    do, bit for bit."""
    cfg = small_config(steps=2, checkpoint_every=50, task={"warmup_steps": 3}, sharding=sharding)
    data = cfg.model_dump_json()
    for i, (run, stop, resume) in enumerate(
        [("part", True, False), ("part", False, True), ("full", False, False)]
    ):
        init = f"file://{tmp_path / f'rendezvous{i}'}"
        mp.spawn(
            _warmup_stop_rank, args=(2, init, data, str(tmp_path), run, stop, resume), nprocs=2
        )
        if i == 0:  # stopped at the second question: one warm-up step done, and checkpointed
            [ckpt] = list_checkpoints(tmp_path / "part")
            meta = yaml.safe_load((ckpt / "meta.json").read_text())
            assert (ckpt.name, meta["warmup"]) == ("step-000000", {"done": 1, "total": 3})
            assert (ckpt / "dcp").is_dir() == (sharding == "fsdp")
    assert [torch.load(tmp_path / f"stop{r}.pt") for r in range(2)] == [(2, False), (2, False)]
    rows = strip_timing(read_metrics(tmp_path / "part"))
    assert [r["step"] for r in rows] == [1, 2]
    assert rows == strip_timing(read_metrics(tmp_path / "full"))
    a = load_file(str(tmp_path / "full" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
