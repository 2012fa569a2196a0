"""The rows of `bench/gpu_check.py`, each group run in a process of its own:

    python bench/gpu_check_rows.py GROUP PLAN.json RESULT.json

GROUP is `train` (the rows `train` and `memory`: one run measures both), one of the `MEMORY`
rows (the budget's estimate against one step's peak for another model kind), `dp`, `fsdp` or
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

MEMORY: dict[str, str] = {
    "mem-qwen2": "a Qwen2 of the Llama's shape, built by the parent",
    "mem-lora": "the Llama with LoRA adapters (r 16, every linear layer but the output)",
    "mem-builtin": "builtin:tiny of the Llama's width, depth, heads and vocabulary",
    "mem-unfused": "the Llama with the unfused loss, on a quarter of the prompts",
}
"""The memory rows beside the Llama's own (`memory`): one step of each kind in a process of its
own, its peak against `core.budget.estimate` (the fsdp row reports the same for FSDP)."""

GROUPS: dict[str, tuple[str, ...]] = {
    "train": ("train", "memory"),
    **{name: (name,) for name in MEMORY},
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
    qwen_model: str | None = None  # a Qwen2 of the Llama's shape (the mem-qwen2 row)


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


def memory_spec(plan: Plan, row: str) -> dict[str, Any]:
    """The `train` section of a `MEMORY` row: one step of the train row's batch."""
    spec = train_spec(plan)
    spec["steps"] = 1
    if row == "mem-qwen2":
        if plan.qwen_model is None:
            raise RuntimeError("the parent built no Qwen2 model")
        spec["model"]["name"] = f"hf:{plan.qwen_model}"
    elif row == "mem-lora":
        spec["model"]["lora"] = {"r": 16, "alpha": 32}
    elif row == "mem-builtin":
        c = json.loads((Path(plan.model) / "config.json").read_text())
        longest = plan.prompt_tokens + 1 + plan.new_tokens  # the byte tokenizer's BOS
        tiny = {
            "d_model": c["hidden_size"],
            "n_layers": c["num_hidden_layers"],
            "n_heads": c["num_attention_heads"],
            "max_seq_len": -(-longest // 8) * 8,
            "vocab_size": c["vocab_size"],
        }
        spec["model"] = {"name": "builtin:tiny", "dtype": plan.dtype, "tiny": tiny}
    elif row == "mem-unfused":
        spec["algorithm"]["fused_loss"] = False
        spec["rollout"]["prompts_per_step"] = max(plan.prompts // 4, 1)
    else:
        raise ValueError(f"no memory row {row!r}")
    return spec


def _train(plan: Plan, cfg: TrainConfig, out: Path, world: World | None = None) -> dict[str, float]:
    """The run, through the trainer's own entry point; its last step's metrics."""
    from core.training.trainer import train

    result = train(cfg, out, world=world)
    if result.step != cfg.steps:
        raise RuntimeError(f"the run stopped at step {result.step} of {cfg.steps}")
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


class Peak:
    """One run's peak memory: CUDA, the allocator's (`max_memory_allocated`, the context
    aside); CPU, the process's peak RSS (VmHWM) above its RSS when `start` was called (after the
    imports, the model's code among them, as bench/budget_calibration.py measures)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.base = 0

    def start(self) -> None:
        import torch

        from bench.budget_calibration import rss_bytes

        self.base = rss_bytes()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def figures(self, cfg: TrainConfig, *, devices: int = 1) -> dict[str, Figure]:
        """The peak since `start` against the budget's estimate of `cfg` for this device."""
        import torch

        from bench.budget_calibration import peak_rss_bytes
        from core.budget import estimate

        measured = torch.cuda.max_memory_allocated() if self.cuda else peak_rss_bytes() - self.base
        budget = estimate(cfg, queue="gpu" if self.cuda else "cpu", devices=devices)
        if budget.peak_memory_bytes is None or budget.params is None:
            raise RuntimeError(f"no estimate: {'; '.join(budget.notes)}")
        gib = 2**30
        out: dict[str, Figure] = {
            "estimate_params": budget.params,
            "estimate_fused": "yes" if budget.fused_loss else "no",
            "estimate_gib": budget.peak_memory_bytes / gib,
            "measured_gib": measured / gib,
            "ratio": budget.peak_memory_bytes / measured,
        }
        if self.cuda:
            out["reserved_gib"] = torch.cuda.max_memory_reserved() / gib
        return out


def _import_model_code(plan: Plan, cfg: TrainConfig) -> None:
    """Before the baseline: transformers imports a model's code when it first loads one, 115
    to 185 MiB of RSS by version (measured here), code rather than the job's memory."""
    from bench.budget_calibration import import_model_code

    import_model_code(cfg)
    import core.training.trainer  # noqa: F401


def train_group(plan: Plan) -> list[Row]:
    """Rows 1 and 2: the RL step's speed, then its peak memory against the budget's estimate
    (`Peak`)."""
    cuda = plan.device == "cuda"
    cfg = config(plan)
    _import_model_code(plan, cfg)
    peak = Peak(cuda)
    measured: dict[str, dict[str, Figure]] = {}

    def train_row() -> dict[str, Figure]:
        probe = _FusedProbe()
        peak.start()
        metrics = _train(plan, cfg, Path(plan.work) / "train")
        measured["memory"] = peak.figures(cfg)
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
        if "memory" not in measured:
            raise RuntimeError("nothing measured: the train row's run failed")
        return measured["memory"]

    return [run_row("train", train_row), run_row("memory", memory_row)]


def memory_group(plan: Plan, name: str) -> list[Row]:
    """A `MEMORY` row: one step of its kind, its peak against the estimate, and whether the
    loss the estimate counts (`fused_loss`) is the one that ran."""
    from core.config import TrainConfig

    def row() -> dict[str, Figure]:
        cfg = TrainConfig.model_validate(memory_spec(plan, name))
        _import_model_code(plan, cfg)
        peak = Peak(plan.device == "cuda")
        probe = _FusedProbe()
        peak.start()
        _train(plan, cfg, Path(plan.work) / name)
        figures = peak.figures(cfg)
        ran = "yes" if probe.calls else "no"
        if figures["estimate_fused"] != ran:
            raise RuntimeError(f"the estimate counts fused={figures['estimate_fused']}, ran {ran}")
        return figures

    return [run_row(name, row)]


def data_parallel_group(plan: Plan, sharding: str) -> list[Row]:
    """Row 3: the run in a process group of one (nccl on CUDA, gloo on CPU), joined and left
    as `pdppo train --nproc N` and a worker's ranks do, replicated or sharded with FSDP2."""
    name = "fsdp" if sharding == "fsdp" else "dp"

    def row() -> dict[str, Figure]:
        import torch.distributed as dist

        from core.parallel.distributed import free_port, join_group, leave_group

        out = Path(plan.work) / name
        cfg = config(plan, sharding=sharding)
        _import_model_code(plan, cfg)
        peak = Peak(plan.device == "cuda")
        join_group(0, 1, free_port(), cuda=plan.device == "cuda")
        try:
            backend = str(dist.get_backend())
            peak.start()
            metrics = _train(plan, cfg, out, GroupOfOne(0, 1))
            dist.barrier()
        finally:
            leave_group()
        figures: dict[str, Figure] = {"backend": backend, **step_figures(plan, metrics)}
        if sharding == "fsdp":  # sharded in a group of one: its buffers, not its savings
            memory = peak.figures(cfg)
            figures.update({k: memory[k] for k in ("estimate_gib", "measured_gib", "ratio")})
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


def _memory_runner(name: str) -> Callable[[Plan], list[Row]]:
    return lambda plan: memory_group(plan, name)


RUNNERS: dict[str, Callable[[Plan], list[Row]]] = {
    "train": train_group,
    **{name: _memory_runner(name) for name in MEMORY},
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
