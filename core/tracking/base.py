"""What a tracker does, where it reports, and the run it reports to."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.extras import require

TRACKERS = ("tensorboard", "mlflow", "wandb")
"""The trackers a spec's `report_to` may name (and `PDPPO_REPORT_TO`)."""

EXTRAS: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard",),
    "mlflow": ("mlflow",),
    "wandb": ("wandb",),
}
"""Each tracker's extra (named as the tracker) and the modules it needs."""


@dataclass(frozen=True)
class TrackingOptions:
    """Where and how a run reports: the operator's (`pdppo.settings`, or the environment of a
    local `pdppo train`), never a spec's, so that a tenant never holds a tracker's credentials.

    `tensorboard_dir`: None writes the event files under the run's own folder
    (`<out_dir>/tensorboard`, in a service job's download); a folder puts each run in
    `<tensorboard_dir>/<run_name>`."""

    report_to: tuple[str, ...] = ()
    run_name: str = "pdppo"
    tensorboard_dir: Path | None = None
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "pdppo"
    wandb_project: str = "pdppo"
    wandb_entity: str | None = None
    wandb_mode: str | None = None  # online, offline, disabled; None: wandb's own default
    wandb_dir: Path | None = None  # None: under the run's folder
    tags: Mapping[str, str] = field(default_factory=dict)  # the tenant, the job id
    queue_size: int = 10_000  # reports held per tracker while it is away; the oldest go first
    close_seconds: float = 10.0  # how long the end of a run waits for the last reports
    retry_seconds: float = 0.5  # the first wait after a failed report; doubles up to the next
    max_retry_seconds: float = 10.0


@dataclass
class TrackerRun:
    """The tracker's run a pdppo run reports to, and how far it got: kept in the run's folder
    (`tracking.json`), so that a resumed run continues it without logging a step twice.
    `delivered`: per kind of report, the highest key (a step, a config version) it took."""

    tracker: str
    run_id: str
    url: str | None = None
    delivered: dict[str, int] = field(default_factory=dict)

    def public(self) -> dict[str, str]:
        """What a job record and a user see: the id and, where there is one, the link."""
        out = {"run_id": self.run_id}
        if self.url:
            out["url"] = self.url
        return out


class Tracker(ABC):
    """One tracker's library, driven from one background thread (`core.tracking.channel`):
    any method may raise (the tracker is down), and is then called again with the same
    arguments after a wait, so each must be safe to repeat."""

    name: str

    def __init__(self, options: TrackingOptions, out_dir: Path) -> None:
        self.options = options
        self.out_dir = out_dir

    @abstractmethod
    def open(self, previous: TrackerRun | None, resume_step: int | None) -> TrackerRun:
        """Start the tracker's run, or continue `previous` (a resumed pdppo run, checkpointed at
        `resume_step`). Returns the run, with what it had taken already."""

    @abstractmethod
    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Numbers measured at `step`, their names prefixed (`train/loss`, `eval/reward`)."""

    def metrics_many(self, items: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """Several steps' `metrics` at once, in order (queued while the tracker was slow)."""
        for step, metrics in items:
            self.metrics(step, metrics)

    @abstractmethod
    def table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Rows of one table at `step` (the rollout's samples)."""

    @abstractmethod
    def config(self, config: Mapping[str, Any]) -> None:
        """The run's configuration, flattened to dotted names, at its start."""

    @abstractmethod
    def event(self, step: int, tag: str, data: Mapping[str, Any]) -> None:
        """A tagged event at `step`: a steering change (`config`), a checkpoint."""

    @abstractmethod
    def close(self) -> None:
        """Flush and end the tracker's run (once, at the end of the pdppo run)."""


def require_trackers(names: Sequence[str]) -> None:
    """`MissingExtra` naming the extra to install, before any step, when one is missing."""
    for name in names:
        require(f"report_to: {name}", name, EXTRAS[name])


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}; lists as JSON (trackers take scalars)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out
