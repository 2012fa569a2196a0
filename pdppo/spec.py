"""The job spec: the one model shared by the API (request body), the workers and `pdppo train`.

`train` is the core trainer's own config; the spec adds what only the service cares about (a name,
the resources to schedule on). No torch import here: the API validates specs without the trainer.
Validation is as strict as the trainer's (`core.config`): no type coercion, finite numbers only,
no control characters in names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.config import TrainConfig
from core.config.names import explained
from core.config.types import FINITE, NO_CONTROL_CHARS
from pdppo.queues import MAX_DEVICES, job_queue

__all__ = ["JobSpec", "Resources", "SpecError", "load_spec"]


_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Resources(BaseModel):
    model_config = _STRICT

    device: Literal["cpu", "gpu"] = Field(
        default="cpu", description="Worker queue the job runs on."
    )
    gpus: int = Field(
        default=1,
        ge=1,
        le=MAX_DEVICES,
        description=(
            "Devices the job trains on, as that many data-parallel processes on one worker "
            "(torch.distributed: nccl on GPUs, gloo on CPU, where a device is a process); "
            "rollout.prompts_per_step must split evenly over them. A worker runs it only if it "
            "declared as many (`pdppo worker --devices`); at most the server's "
            "PDPPO_MAX_JOB_DEVICES."
        ),
    )
    timeout_minutes: Annotated[float, Field(gt=0, le=10_000_000), FINITE] | None = Field(
        default=None,
        description=(
            "Wall-clock limit of one run of the job; past it the job stops, keeps its "
            "checkpoint and fails with error code `timeout`. Unset: the server's default "
            "(PDPPO_JOB_TIMEOUT_MINUTES); at most the server's PDPPO_MAX_JOB_TIMEOUT_MINUTES."
        ),
    )


class JobSpec(BaseModel):
    model_config = _STRICT

    name: Annotated[str, Field(max_length=200), NO_CONTROL_CHARS] | None = Field(
        default=None, description="Human label for the job."
    )
    resources: Resources = Field(default_factory=lambda: Resources(), description="Where to run.")
    train: TrainConfig = Field(description="The trainer's configuration.")

    @model_validator(mode="after")
    def _device_fits_queue(self) -> JobSpec:
        """A job routed to a CPU worker cannot train on CUDA: caught at submission, rather than
        as a failed job minutes later. (A GPU job may still pin itself to the CPU.)"""
        if self.resources.device == "cpu" and self.train.device == "cuda":
            raise ValueError(
                "train.device='cuda' cannot run on a resources.device='cpu' worker; "
                "use resources.device='gpu' or train.device='auto'"
            )
        return self

    @model_validator(mode="after")
    def _splits_over_devices(self) -> JobSpec:
        problem = self.train.data_parallel_problem(self.resources.gpus)
        if problem is not None:
            raise ValueError(f"resources.gpus={self.resources.gpus}: {problem}")
        return self

    @property
    def queue(self) -> str:
        """The worker queue the job waits on (`pdppo.queues`)."""
        return job_queue(self.resources.device, self.resources.gpus)


class SpecError(ValueError):
    """A spec file that cannot be read or does not validate; the message names the field."""


def format_validation_error(exc: ValidationError) -> str:
    """Every error of a spec, one per line: where, what is wrong, and the value given (unless
    the message shows it already); an unknown key with the close field (`core.config.names`)."""
    lines = []
    for err in explained(exc.errors(), JobSpec):
        loc = ".".join(str(p) for p in err["loc"]) or "(spec)"
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        said = isinstance(value, dict) or "(got " in msg or repr(value) in msg
        lines.append(f"{loc}: {msg}" if said else f"{loc}: {msg} (got {value!r})")
    return "\n".join(lines)


def parse_spec(data: Any, source: str = "spec") -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a job spec must be a mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: invalid job spec\n{format_validation_error(exc)}") from exc


def load_spec(path: Path) -> JobSpec:
    """A JobSpec from a YAML or JSON file (JSON is YAML, but `.json` gets JSON's error messages).

    Relative dataset and model paths are resolved against the file's folder, exactly as
    `pdppo submit` does (`pdppo.client.resolve_spec_paths`), so the same file means the same data
    under `pdppo train` and `pdppo submit`, whatever the current directory."""
    from pdppo.client.specs import resolve_spec_paths, spec_yaml_load

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else spec_yaml_load(text)
    except (ValueError, ImportError) as exc:
        raise SpecError(f"{path}: not valid YAML/JSON ({exc})") from exc
    except Exception as exc:  # yaml.YAMLError has no common base we can import lazily
        raise SpecError(f"{path}: not valid YAML/JSON ({exc})") from exc
    if isinstance(data, dict):
        data = resolve_spec_paths(data, path.absolute().parent)
    return parse_spec(data, str(path))
