"""What one worker of each queue can hold (`core.budget`): POST /v1/jobs refuses (422) a spec
whose estimate is over a limit, and the worker checks again before it loads the model.
`pdppo.settings.Settings` inherits these fields (one settings object, read from `PDPPO_*`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field
from pydantic_settings import BaseSettings

if TYPE_CHECKING:
    from core.budget import Limits


class BudgetSettings(BaseSettings):
    # 0 disables a check. The memory estimate is an upper bound (measured: 1.3-1.9x the real
    # peak on CPU), for the job alone: the worker process's own ~0.5 GiB come on top.
    max_job_memory_gb_cpu: float = Field(
        default=12.0,
        ge=0,
        description=(
            "largest estimated peak memory (GiB of RAM) of a job on the cpu queue; the default "
            "fits a 2-core, 24 GiB worker with room for the worker itself and the OS"
        ),
    )
    max_job_memory_gb_gpu: float = Field(
        default=70.0,
        ge=0,
        description=(
            "largest estimated peak GPU memory (GiB) of a job on the gpu queue; the default "
            "fits an 80 GB GPU with room for fragmentation"
        ),
    )
    max_params_cpu: int = Field(
        default=1_000_000_000,
        ge=0,
        description="largest model (parameters, LoRA adapters included) a cpu-queue job may train",
    )
    max_params_gpu: int = Field(
        default=20_000_000_000,
        ge=0,
        description="largest model (parameters, LoRA adapters included) a gpu-queue job may train",
    )
    max_tokens_per_step: int = Field(
        default=16_000_000,
        ge=0,
        description=(
            "largest rollout batch in tokens: prompts_per_step * group_size * (longest prompt "
            "+ max_new_tokens)"
        ),
    )
    max_total_tokens: int = Field(
        default=50_000_000_000,
        ge=0,
        description="largest run in tokens: tokens per step * steps (the warm-up not counted)",
    )

    def budget_limits(self, queue: Literal["cpu", "gpu"]) -> Limits:
        """The limits `core.budget.check` applies to a job of `queue` (0 in a setting: none).

        Imported here, not at the top: `core` imports torch, which settings readers such as the
        Celery app's configuration should not pay for."""
        from core.budget import Limits

        memory_gb = self.max_job_memory_gb_gpu if queue == "gpu" else self.max_job_memory_gb_cpu
        params = self.max_params_gpu if queue == "gpu" else self.max_params_cpu
        return Limits(
            queue=queue,
            max_memory_bytes=int(memory_gb * 2**30) or None,
            max_params=params or None,
            max_tokens_per_step=self.max_tokens_per_step or None,
            max_total_tokens=self.max_total_tokens or None,
        )
