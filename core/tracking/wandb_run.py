"""Weights & Biases: a run per pdppo run (the `wandb` extra). Project, entity and mode are the
operator's (`PDPPO_WANDB_*`); the API key is wandb's own setting (`WANDB_API_KEY` in the
worker's environment, or `wandb login`), never a spec's. A resumed run continues the same W&B
run (`resume="allow"` with the id kept in `tracking.json`). Samples are W&B tables; a checkpoint
is an artifact holding a reference to its folder (nothing uploaded); a steering change goes into
the run's config under `steering.v<version>`. The run's files are under `<out_dir>/wandb`
unless the operator names a folder (`PDPPO_WANDB_DIR`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.tracking.base import Tracker, TrackerRun


class WandbTracker(Tracker):
    name = "wandb"

    def open(self, previous: TrackerRun | None, resume_step: int | None) -> TrackerRun:
        import wandb

        options = self.options
        run_id = previous.run_id if previous is not None else uuid.uuid4().hex[:12]
        folder = options.wandb_dir or self.out_dir
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=options.wandb_project,
            entity=options.wandb_entity,
            mode=options.wandb_mode,  # type: ignore[arg-type]
            name=options.run_name,
            id=run_id,
            resume="allow",
            dir=str(folder),
            tags=[f"{k}:{v}" for k, v in options.tags.items()],
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        delivered = dict(previous.delivered) if previous is not None else {}
        url = self.run.url if options.wandb_mode != "offline" else None
        return TrackerRun(self.name, run_id=run_id, url=url, delivered=delivered)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        import wandb

        if not rows:
            return
        columns: list[str | int] = list(rows[0])
        data = [[row.get(str(column)) for column in columns] for row in rows]
        self.run.log({name: wandb.Table(columns=columns, data=data)}, step=step)

    def config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def event(self, step: int, tag: str, data: Mapping[str, Any]) -> None:
        import wandb

        if tag == "checkpoint" and Path(str(data["path"])).is_dir():
            artifact = wandb.Artifact(f"checkpoint-{self.run.id}", type="checkpoint")
            artifact.metadata.update(dict(data))
            artifact.add_reference(Path(str(data["path"])).resolve().as_uri(), checksum=False)
            self.run.log_artifact(artifact, aliases=[f"step-{step}"])
        elif tag == "config":
            version = data.get("version")
            self.run.config.update({f"steering.v{version}": dict(data)}, allow_val_change=True)
        self.run.summary[f"pdppo/{tag}"] = dict(data)

    def close(self) -> None:
        self.run.finish()
