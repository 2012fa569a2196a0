"""The operator's side of experiment tracking (`train.report_to`, `core.tracking`): where runs
report and as whom. `pdppo.settings.Settings` inherits these fields (one settings object, read
from `PDPPO_*`); they live here to keep that module small. A spec only names trackers: a tenant
never supplies a tracking URI, a W&B project or a key (W&B's key is wandb's own `WANDB_API_KEY`
in the worker's environment, or its `wandb login`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from core.tracking import TRACKERS, TrackingOptions


class TrackingSettings(BaseSettings):
    report_to: str = Field(
        default="",
        description=(
            "trackers every job reports to, besides those its spec's train.report_to names: "
            "comma-separated tensorboard, mlflow, wandb (each needs its extra on the workers)"
        ),
    )
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="the MLflow server jobs report to (unset: MLflow's own MLFLOW_TRACKING_URI)",
    )
    mlflow_experiment: str = Field(default="pdppo", description="the MLflow experiment of jobs")
    wandb_project: str = Field(default="pdppo", description="the W&B project of jobs")
    wandb_entity: str | None = Field(default=None, description="the W&B entity (team) of jobs")
    wandb_mode: Literal["online", "offline", "disabled"] | None = Field(
        default=None, description="W&B's mode (unset: wandb's own default, WANDB_MODE)"
    )
    wandb_dir: Path | None = Field(
        default=None, description="where W&B keeps its run files (unset: the job's folder)"
    )
    tensorboard_dir: Path | None = Field(
        default=None,
        description=(
            "a root for TensorBoard's event files, one folder per job id (unset: the job's "
            "own folder, <artifact_dir>/<job id>/tensorboard, in its download)"
        ),
    )
    tracking_queue_size: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description="reports held per tracker while it is away before the oldest are dropped",
    )
    tracking_close_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="how long a job's end waits for its last reports to a slow tracker",
    )

    @field_validator("report_to")
    @classmethod
    def _check_report_to(cls, value: str) -> str:
        unknown = [name for name in _names(value) if name not in TRACKERS]
        if unknown:
            raise ValueError(f"report_to names {unknown}: trackers are {', '.join(TRACKERS)}")
        return value

    def tracking_options(self, run_name: str, tags: dict[str, str]) -> TrackingOptions:
        """Where a run called `run_name` (a job id) reports; `tags` go on its tracker runs."""
        return TrackingOptions(
            report_to=_names(self.report_to),
            run_name=run_name,
            tensorboard_dir=self.tensorboard_dir,
            mlflow_tracking_uri=self.mlflow_tracking_uri,
            mlflow_experiment=self.mlflow_experiment,
            wandb_project=self.wandb_project,
            wandb_entity=self.wandb_entity,
            wandb_mode=self.wandb_mode,
            wandb_dir=self.wandb_dir,
            tags=tags,
            queue_size=self.tracking_queue_size,
            close_seconds=self.tracking_close_seconds,
        )


def _names(raw: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
