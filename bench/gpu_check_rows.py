"""The rows of `bench/gpu_check.py`, each group run in a process of its own:

    python bench/gpu_check_rows.py GROUP PLAN.json RESULT.json

GROUP is `train` (the rows `train` and `memory`: one run measures both), `dp`, `fsdp` or
`vllm`. A process per group keeps what one row leaves behind out of the next: a CUDA context
broken by a bad kernel, a process group that never tore down, a hung collective (the parent
kills it at its timeout), and the allocator's peak, which is per process. Every row drives the
real trainer (`core.training.trainer.train`, what `pdppo train` and a worker's job call) on the
model and data the parent built; `run_row` turns an exception into a FAILED row, so one broken path
does not hide the others.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from core.parallel.distributed import World  # noqa: E402  (after the repo root is on the path)

if TYPE_CHECKING:
    from core.config import TrainConfig

FAIL_ENV = "PDPPO_GPU_CHECK_FAIL"
"""Comma-separated row names that raise at their start: how the test proves that a broken row
is reported and fails the run."""

GROUPS: dict[str, tuple[str, ...]] = {
    "train": ("train", "memory"),
    "dp": ("dp",),
    "fsdp": ("fsdp",),
    "vllm": ("vllm",),
}
"""Each child process and the rows it reports, in table order."""

Figure = int | float | str


@dataclass
class Row:
    name: str
    status: str  # "ok", "skipped" or "FAILED"
    figures: dict[str, Figure] = field(default_factory=dict)
    detail: str = ""  # why it was skipped, or the error


class Skipped(Exception):
    """A row that cannot run on this machine, with the reason: not a failure."""


def run_row(name: str, fn: Callable[[], dict[str, Figure]]) -> Row:
    """`fn`'s figures, or its exception as the row's result: a broken path is a line of the
    table, and the rows after it still run."""
    try:
        if name in os.environ.get(FAIL_ENV, "").split(","):
            raise RuntimeError(f"forced by {FAIL_ENV}")
        return Row(name, "ok", fn())
    except Skipped as skip:
        return Row(name, "skipped", detail=str(skip))
    except Exception as exc:
        return Row(name, "FAILED", detail=f"{type(exc).__name__}: {exc}".replace("\n", " "))


def exit_code(rows: list[Row]) -> int:
    return 1 if any(r.status == "FAILED" for r in rows) else 0


@dataclass(frozen=True)
class Plan:
    """What the parent built and every row trains on."""

    device: str  # "cuda" or "cpu"
    dtype: str  # of the weights and of the rollouts (one copy of the model)
    model: str  # folder of the locally built Llama
    data: str  # its prompts, JSONL
    work: str  # where the runs write
    prompts: int
    group: int
    new_tokens: int
    prompt_tokens: int  # every prompt's length in tokens
    steps: int
    pattern: str  # the reward: 1 when the completion contains it
    params: int
    embedding_params: int
    peak_flops: float | None  # the device's peak; None: no MFU


@dataclass(frozen=True)
class GroupOfOne(World):
    """Rank 0 of a process group of one that takes the data-parallel branches. `pdppo train
    --nproc 1` starts no group (one process trains as always), so on a machine of one device
    this is how every collective and FSDP2 call of a job of N devices runs once."""

    @property
    def parallel(self) -> bool:
        return True


def config(plan: Plan, *, sharding: str = "replicate", engine: str = "hf") -> TrainConfig:
    from core.config import TrainConfig

    return TrainConfig.model_validate(train_spec(plan, sharding=sharding, engine=engine))


def train_spec(plan: Plan, *, sharding: str = "replicate", engine: str = "hf") -> dict[str, Any]:
    """A job spec's `train` section for the run (the API's tests submit it as is)."""
    return {
        "model": {"name": f"hf:{plan.model}", "dtype": plan.dtype},
        "task": {
            "name": "jsonl",
            "path": plan.data,
            "grader": {"type": "regex", "pattern": plan.pattern, "mode": "search"},
        },
        "rollout": {
            "prompts_per_step": plan.prompts,
            "group_size": plan.group,
            "max_new_tokens": plan.new_tokens,
            "dtype": plan.dtype,
            "engine": engine,
        },
        "algorithm": {"mask": "predictive", "estimator": "topk", "fused_loss": True},
        "optim": {"lr": 1e-6},
        "steps": plan.steps,
        "checkpoint_every": 0,
        "seed": 0,
        "device": plan.device,
        "sharding": sharding,
    }


def step_figures(plan: Plan, metrics: dict[str, float]) -> dict[str, Figure]:
    """Speed of one step (the last: the first pays for warm-up). Model FLOPs count every
    parameter but the input embedding (a lookup) once per token: 2N for a token sampled, 6N
    for a token trained on (forward and backward); the tokens are each distinct prompt once
    (its group shares its prefill and its training forward) and every completion token.
    Attention's own FLOPs and the fused loss's recomputed logits are not counted."""
    response = metrics["response_len"] * plan.prompts * plan.group
    tokens = plan.prompts * plan.prompt_tokens + response
    n = plan.params - plan.embedding_params
    step, update = metrics["step_time"], metrics["update_time"]
    flops = 8 * n * tokens
    out: dict[str, Figure] = {
        "step_s": step,
        "rollout_s": metrics["rollout_time"],
        "update_s": update,
        "tokens_per_s": response / step,
        "model_tflops": flops / step / 1e12,
    }
    if plan.peak_flops:
        out["mfu"] = flops / step / plan.peak_flops
        out["update_mfu"] = 6 * n * tokens / update / plan.peak_flops
    return out


def _train(plan: Plan, cfg: TrainConfig, out: Path, world: World | None = None) -> dict[str, float]:
    """The run, through the trainer's own entry point; its last step's metrics."""
    from core.training.trainer import train

    result = train(cfg, out, world=world)
    if result.step != plan.steps:
        raise RuntimeError(f"the run stopped at step {result.step} of {plan.steps}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return cast(dict[str, float], json.loads(lines[-1]))


class _FusedProbe:
    """Counts the loss pieces that took the fused path (`response_projection` gave the hidden
    states and the output layer): the config asks for it, but the trainer falls back to the
    full logits without a word where it does not apply."""

    def __init__(self) -> None:
        import core.training.update
        from core.rollout import response_projection as real

        self.calls = 0

        def counted(*args: Any, **kwargs: Any) -> Any:
            got = real(*args, **kwargs)
            self.calls += got is not None
            return got

        cast(Any, core.training.update).response_projection = counted  # the name its loss calls


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def train_group(plan: Plan) -> list[Row]:
    """Rows 1 and 2: the RL step's speed, then its peak memory against the budget's estimate
    (CUDA: the allocator's peak; CPU: peak RSS above the RSS after the imports, as
    bench/budget_calibration.py measures, the model's code among the imports)."""
    import torch

    # imported before the RSS baseline: transformers imports a model's code when it first
    # loads one, 115 to 185 MiB of RSS by version (measured here), code rather than the job's
    # memory, which would otherwise count as the run's peak
    import transformers.models.llama.modeling_llama  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import core.models.hf
    import core.training.trainer  # noqa: F401

    cuda = plan.device == "cuda"
    measured: dict[str, float] = {}

    def train_row() -> dict[str, Figure]:
        cfg = config(plan)
        probe = _FusedProbe()
        base = _rss_bytes()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        metrics = _train(plan, cfg, Path(plan.work) / "train")
        if cuda:
            measured["bytes"] = torch.cuda.max_memory_allocated()
            measured["reserved"] = torch.cuda.max_memory_reserved()
        else:
            measured["bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
        if probe.calls == 0:  # the config asks for it: a fallback here is a fault to see
            raise RuntimeError("the fused loss never ran: the trainer fell back to full logits")
        return {
            "params": plan.params,
            **step_figures(plan, metrics),
            "fused_pieces": probe.calls,
            "masked_fraction": metrics["masked_fraction"],
            "grad_norm": metrics["grad_norm"],
        }

    def memory_row() -> dict[str, Figure]:
        from core.budget import estimate

        if "bytes" not in measured:
            raise RuntimeError("nothing measured: the train row's run failed")
        budget = estimate(config(plan), queue="gpu" if cuda else "cpu")
        if budget.peak_memory_bytes is None or budget.params is None:
            raise RuntimeError(f"no estimate: {'; '.join(budget.notes)}")
        gib = 2**30
        out: dict[str, Figure] = {
            "estimate_params": budget.params,
            "estimate_gib": budget.peak_memory_bytes / gib,
            "measured_gib": measured["bytes"] / gib,
            "ratio": budget.peak_memory_bytes / measured["bytes"],
        }
        if cuda:
            out["reserved_gib"] = measured["reserved"] / gib
        return out

    return [run_row("train", train_row), run_row("memory", memory_row)]


def data_parallel_group(plan: Plan, sharding: str) -> list[Row]:
    """Row 3: the run in a process group of one (nccl on CUDA, gloo on CPU), joined and left
    as `pdppo train --nproc N` and a worker's ranks do, replicated or sharded with FSDP2."""
    name = "fsdp" if sharding == "fsdp" else "dp"

    def row() -> dict[str, Figure]:
        import torch.distributed as dist

        from core.parallel.distributed import free_port, join_group, leave_group

        out = Path(plan.work) / name
        join_group(0, 1, free_port(), cuda=plan.device == "cuda")
        try:
            backend = str(dist.get_backend())
            metrics = _train(plan, config(plan, sharding=sharding), out, GroupOfOne(0, 1))
            dist.barrier()
        finally:
            leave_group()
        figures: dict[str, Figure] = {"backend": backend, **step_figures(plan, metrics)}
        # a sharded run writes its checkpoint as torch.distributed.checkpoint shards
        figures["dcp_files"] = len(list((out / "checkpoints").glob("*/dcp/*")))
        if (sharding == "fsdp") != bool(figures["dcp_files"]):
            raise RuntimeError(f"sharding={sharding!r} wrote {figures['dcp_files']} dcp files")
        figures["grad_norm"] = metrics["grad_norm"]
        return figures

    return [run_row(name, row)]


def vllm_group(plan: Plan) -> list[Row]:
    """Row 4: rollouts sampled by an in-process vLLM engine, given the weights every step."""

    def row() -> dict[str, Figure]:
        from core.rollout.vllm_engine import vllm_available

        if not vllm_available():
            raise Skipped("vllm not installed")
        metrics = _train(plan, config(plan, engine="vllm"), Path(plan.work) / "vllm")
        return {
            **step_figures(plan, metrics),
            "sync_s": metrics["weight_sync_time"],
            "offpolicy_logratio_abs": metrics["offpolicy_logratio_abs"],
        }

    return [run_row("vllm", row)]


RUNNERS: dict[str, Callable[[Plan], list[Row]]] = {
    "train": train_group,
    "dp": lambda plan: data_parallel_group(plan, "replicate"),
    "fsdp": lambda plan: data_parallel_group(plan, "fsdp"),
    "vllm": vllm_group,
}


def main(argv: list[str]) -> None:
    group, plan_path, result_path = argv
    plan = Plan(**json.loads(Path(plan_path).read_text()))
    rows = RUNNERS[group](plan)
    Path(result_path).write_text(json.dumps([asdict(r) for r in rows]))


if __name__ == "__main__":
    main(sys.argv[1:])
