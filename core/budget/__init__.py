"""What a job will cost, from its `TrainConfig` alone: parameters, tokens, and peak memory.

A shared service must refuse a spec that would take a worker down *before* it runs: a worker that
the kernel OOM-kills loses its running job and every job queued behind it, and a job that grows
for minutes before dying wastes the queue's time. So the API (at submit), `pdppo train --dry-run`
and the worker (before it loads the model) all call `estimate` and `check` here.

This package itself imports no torch (pydantic config, `core.disk.safe_files`, the standard library)
and `estimate` costs microseconds for a built-in model. (The `core` package's `__init__` does
import torch; the API already pays that through `core.config`.)

This module holds what callers use: `estimate` (a `Budget`), `check` (a `Problem` for each of
the `Limits` a budget exceeds), and re-exports the public names of the modules that do the work:

- `shapes`: parameter counts and model shapes (built-in dims, safetensors headers, config.json,
  LoRA adapters, the Hugging Face cache);
- `tokens`: an upper bound on a prompt's tokens;
- `memory`: the memory items the trainer allocates and the peak they make (how it is calibrated);
- `report`: `format_bytes`, `format_count` and the lines people read (`render`, `render_limits`);
- `units`: the byte units.

Names with a leading underscore are shared between these modules, not meant for callers.

Imports: `core.config`, `core.disk` (a model's config.json and safetensors headers, read safely).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from core.budget.memory import OVERHEAD_BYTES as OVERHEAD_BYTES
from core.budget.memory import (
    Device,
    MemoryItem,
    Phase,
    Queue,
    batch_field,
    job_device,
    memory_items,
    model_field,
    peak_of,
    runs_fused_loss,
)
from core.budget.report import describe as describe
from core.budget.report import format_bytes, format_count, render, render_limits
from core.budget.shapes import MAX_HEADER_BYTES as MAX_HEADER_BYTES
from core.budget.shapes import TINY_VOCAB as TINY_VOCAB
from core.budget.shapes import ModelShape, model_shape, tiny_param_count
from core.budget.shapes import lora_param_count as lora_param_count
from core.budget.shapes import read_safetensors_header as read_safetensors_header
from core.budget.tokens import HF_SPECIAL_TOKENS as HF_SPECIAL_TOKENS
from core.budget.tokens import MAX_SCAN_BYTES as MAX_SCAN_BYTES
from core.budget.tokens import UNKNOWN_SEQ_LEN as UNKNOWN_SEQ_LEN
from core.budget.tokens import builtin_answer_chars, prompt_tokens
from core.budget.units import GIB as GIB
from core.budget.units import MIB as MIB
from core.config import BUILTIN_TASKS, TrainConfig

# The names above imported "as" themselves are re-exported: importable from here, as before the
# split, though not in `__all__`.
__all__ = [
    "Budget",
    "Limits",
    "MemoryItem",
    "ModelShape",
    "Problem",
    "check",
    "estimate",
    "format_bytes",
    "format_count",
    "job_device",
    "model_shape",
    "prompt_tokens",
    "render",
    "render_limits",
    "tiny_param_count",
]

_STEPS_DEFAULT = 100


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """What one job will cost. Memory figures are bytes on the job's device (host RAM on CPU)."""

    queue: Queue
    device: Device
    model_source: str
    params: int | None  # all parameters (LoRA: base plus adapters); None: unknown
    trainable_params: int | None
    vocab_size: int | None
    prompt_tokens: int  # upper bound on one prompt's tokens
    sequence_tokens: int  # prompt + rollout.max_new_tokens
    sequences_per_step: int  # prompts_per_step * group_size
    tokens_per_step: int  # sequences_per_step * sequence_tokens
    steps: int
    total_tokens: int  # tokens_per_step * steps (RL only; the warm-up is extra)
    memory: tuple[MemoryItem, ...]  # empty when the model is unknown
    peak_memory_bytes: int | None
    peak_phases: tuple[Phase, ...]  # the phases whose memory adds up to the peak
    fused_loss: bool  # the loss the trainer will run: fused (no [tokens, vocabulary] logits)
    model_field: str  # the field naming the model (for a parameter limit)
    tokens_field: str  # the field that makes tokens per step large
    total_tokens_field: str  # ... and the run's total
    notes: tuple[str, ...] = ()

    def phase_bytes(self) -> dict[Phase, int]:
        out: dict[Phase, int] = {}
        for item in self.memory:
            out[item.phase] = out.get(item.phase, 0) + item.bytes
        return out

    def at_peak(self) -> list[MemoryItem]:
        """The items counted in the peak (all of them on CPU, see `peak_phases`)."""
        return [m for m in self.memory if m.phase in self.peak_phases]

    def to_dict(self) -> dict[str, Any]:
        """JSON data (the API's `estimate`); memory items say whether they count in the peak."""
        data = asdict(self)
        data["memory"] = [
            {**asdict(m), "at_peak": m.phase in self.peak_phases} for m in self.memory
        ]
        data["peak_phases"] = list(self.peak_phases)
        data["notes"] = list(self.notes)
        return data


@dataclass(frozen=True)
class Limits:
    """What one worker of a queue can hold; None (or 0 in settings) disables a check."""

    queue: Queue = "cpu"
    max_memory_bytes: int | None = None
    max_params: int | None = None
    max_tokens_per_step: int | None = None
    max_total_tokens: int | None = None


@dataclass(frozen=True)
class Problem:
    """One limit a job exceeds: the field most responsible, the estimate and the limit."""

    field: str
    kind: Literal["memory", "params", "tokens_per_step", "total_tokens"]
    estimate: int
    limit: int
    message: str  # without the field: "the job would need about 37.2 GiB of memory (...)"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


# -- estimating -------------------------------------------------------------------------------


def estimate(
    cfg: TrainConfig,
    *,
    queue: Queue = "cpu",
    read_files: bool = True,
    data_roots: Sequence[str] | None = None,
    model_dir: Path | None = None,
    devices: int = 1,
) -> Budget:
    """What the job `cfg` will cost on a worker of `queue` ("cpu" or "gpu"); memory is one
    device's, of `devices` that each train a share of the batch (`resources.gpus`), holding a
    whole replica or, with `sharding: fsdp`, a shard of the model (`core.parallel.sharding`).

    Cheap and side-effect free: no torch, no model loading, no network. It reads only the
    headers and config.json of a local `hf:` model (or one in the Hugging Face cache) and
    scans a local jsonl dataset for its longest prompt, each as a regular file under
    `data_roots` (None: no restriction); `read_files=False` reads nothing. `model_dir`: the
    final-model folder a `job:<id>` model name stands for, when the caller can see it."""
    device = job_device(cfg, queue)
    shape = model_shape(cfg, read_files=read_files, data_roots=data_roots, model_dir=model_dir)
    prompt, prompt_note = prompt_tokens(cfg, shape, read_files=read_files, data_roots=data_roots)
    r = cfg.rollout
    sequences = r.prompts_per_step * r.group_size
    seq = prompt + r.max_new_tokens
    tokens = sequences * seq
    batch_f, batch_ratio = batch_field(cfg)
    notes: list[str] = []
    if prompt_note:
        notes.append(prompt_note)
    items: list[MemoryItem] = []
    peak: int | None = None
    peak_phases: tuple[Phase, ...] = ()
    if shape.params is None:
        notes.append(f"no memory estimate: {shape.source}")
    elif not shape.hidden or not shape.layers or not shape.vocab:
        notes.append(f"no memory estimate: {shape.source} (config.json lacks the model's shape)")
    else:
        items = memory_items(cfg, shape, prompt, device, devices)
        peak, peak_phases = peak_of(items)
    if cfg.task.warmup_steps and cfg.task.name in BUILTIN_TASKS:
        notes.append(
            f"the warm-up adds about {format_count(_warmup_tokens(cfg, prompt))} tokens "
            "(not in total_tokens)"
        )
    return Budget(
        queue=queue,
        device=device,
        model_source=shape.source,
        params=shape.params,
        trainable_params=shape.trainable,
        vocab_size=shape.vocab,
        prompt_tokens=prompt,
        sequence_tokens=seq,
        sequences_per_step=sequences,
        tokens_per_step=tokens,
        steps=cfg.steps,
        total_tokens=tokens * cfg.steps,
        memory=tuple(items),
        peak_memory_bytes=peak,
        peak_phases=peak_phases,
        fused_loss=runs_fused_loss(cfg, shape),
        model_field=model_field(cfg),
        tokens_field=batch_f,
        total_tokens_field=batch_f if batch_ratio > cfg.steps / _STEPS_DEFAULT else "train.steps",
        notes=tuple(notes),
    )


def _warmup_tokens(cfg: TrainConfig, prompt: int) -> int:
    t = cfg.task
    return t.warmup_steps * t.warmup_batch_size * (prompt + builtin_answer_chars(t) + 1)


# -- checking ---------------------------------------------------------------------------------


def _responsible(budget: Budget) -> str:
    """The field behind the largest share of the memory alive at the peak (overhead aside)."""
    by_field: dict[str, int] = {}
    for m in budget.at_peak():
        if m.phase != "overhead":
            by_field[m.field] = by_field.get(m.field, 0) + m.bytes
    return max(by_field, key=lambda f: by_field[f]) if by_field else "train"


def check(budget: Budget, limits: Limits) -> list[Problem]:
    """Every limit `budget` exceeds, each naming the spec field most responsible.

    Unknown figures (a model whose size this machine cannot see) are not problems: the worker
    checks again before it loads the model."""
    problems: list[Problem] = []
    where = f"on {limits.queue} workers"
    peak = budget.peak_memory_bytes
    if limits.max_memory_bytes and peak is not None and peak > limits.max_memory_bytes:
        problems.append(
            Problem(
                field=_responsible(budget),
                kind="memory",
                estimate=peak,
                limit=limits.max_memory_bytes,
                message=(
                    f"the job would need about {format_bytes(peak)} of memory "
                    f"(limit {format_bytes(limits.max_memory_bytes)} {where})"
                ),
            )
        )
    if limits.max_params and budget.params is not None and budget.params > limits.max_params:
        problems.append(
            Problem(
                field=budget.model_field,
                kind="params",
                estimate=budget.params,
                limit=limits.max_params,
                message=(
                    f"the model has about {format_count(budget.params)} parameters "
                    f"(limit {format_count(limits.max_params)} {where})"
                ),
            )
        )
    if limits.max_tokens_per_step and budget.tokens_per_step > limits.max_tokens_per_step:
        problems.append(
            Problem(
                field=budget.tokens_field,
                kind="tokens_per_step",
                estimate=budget.tokens_per_step,
                limit=limits.max_tokens_per_step,
                message=(
                    f"a step would process about {format_count(budget.tokens_per_step)} tokens "
                    f"(limit {format_count(limits.max_tokens_per_step)} per step)"
                ),
            )
        )
    if limits.max_total_tokens and budget.total_tokens > limits.max_total_tokens:
        problems.append(
            Problem(
                field=budget.total_tokens_field,
                kind="total_tokens",
                estimate=budget.total_tokens,
                limit=limits.max_total_tokens,
                message=(
                    f"the run would process about {format_count(budget.total_tokens)} tokens "
                    f"(limit {format_count(limits.max_total_tokens)} per job)"
                ),
            )
        )
    return problems
