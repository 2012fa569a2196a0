"""Data parallelism: what one step's update needs from a torch.distributed process group.

Each rank holds a replica of the model and trains on its own share of the rollout batch, whole
groups only (advantages are per group, so a rank's groups give the same advantages as the whole
batch's). Three things make the ranks' update equal to one process's update on the whole batch
(`core.training.update`):

- normalizers are global: a token sum is divided by the whole minibatch's (or batch's) count,
  summed over the ranks, never by the rank's own;
- gradients are summed over the ranks before clipping (each rank's loss already carries the
  global denominator), so every replica clips the same gradient and takes the same step;
- metrics are token-weighted sums and maxima over all ranks, so rank 0 reports the global mask
  statistics, not its own share's.

With one minibatch this is the single-process update up to fp32 summation order. With several,
each rank shuffles its own share into minibatches (a different, equally valid partition of the
batch than one process's shuffle): the updates then differ as two shuffles do.

`World()` (size 1) is the single-process case: every reduction is the identity, no collective is
called and the update is bit for bit the one without this module.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import torch
import torch.distributed as dist

from core.config import TrainConfig

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def parallel(self) -> bool:
        return self.size > 1

    def share(self, items: int) -> slice:
        """This rank's contiguous block of `items` (which the world size must divide)."""
        if items % self.size:
            raise ValueError(f"{items} items do not split over {self.size} ranks")
        per = items // self.size
        return slice(self.rank * per, (self.rank + 1) * per)

    def sums(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the ranks, in one collective (float64)."""
        if not self.parallel:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64, device=_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def sum(self, value: float) -> float:
        return self.sums([value])[0]

    def max(self, value: float) -> float:
        if not self.parallel:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def agree(self, flag: bool) -> bool:
        """True on every rank if it is True on any (a stop asked of one stops all together)."""
        return self.max(float(flag)) > 0 if self.parallel else flag

    def from_rank0(self, value: T) -> T:
        """Rank 0's `value` on every rank (a picklable object, e.g. a config change)."""
        if not self.parallel:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return cast(T, box[0])

    def seed(self, seed: int, step: int) -> int:
        """A seed of its own for this rank's sampling at `step`: ranks draw different
        completions, and a resumed run (on any number of ranks) the same ones again."""
        return (seed * 1_000_003 + step * 8191 + self.rank * 131) % 2**63

    def sum_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Every parameter's gradient summed over the ranks, in place, as one flat buffer (a
        parameter without a gradient counts as zeros: another rank's tokens may reach it)."""
        if not self.parallel:
            return
        params = list(params)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
            offset += n


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a group's rendezvous (rank 0 binds it next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def join_group(rank: int, size: int, port: int, cuda: bool) -> None:
    """This process joins a group of `size` on this machine as `rank`, rendezvous at rank 0's
    `port`: nccl with the GPU of its rank, else gloo on the CPU."""
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
    )


def leave_group() -> None:
    """Tear down this process's group. A vLLM engine in the process (`rollout.engine: vllm`
    on several ranks) built its own groups inside it: those go first, or its exit handler
    finds them invalid and fails the process's end."""
    if "vllm.distributed.parallel_state" in sys.modules:
        _leave_vllm_groups()
    if dist.is_initialized():
        dist.destroy_process_group()


def _leave_vllm_groups() -> None:
    """Destroy the groups vLLM built inside this process's torch.distributed world, the world's
    own included. vLLM is imported here only when a run already imported it (`leave_group`
    checks): the `vllm` extra is optional and its import takes seconds."""
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )

    destroy_model_parallel()
    destroy_distributed_environment()


def _device() -> torch.device:
    """Where a collective's tensors must live: NCCL reduces CUDA tensors only."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_world(cfg: TrainConfig, world: World) -> None:
    """Raises ValueError for a config that cannot run data-parallel on `world`."""
    problem = cfg.data_parallel_problem(world.size)
    if problem is not None:
        raise ValueError(problem)
