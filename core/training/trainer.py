"""`train()`: the trainer's entry point (`pdppo train`, a worker's job, the benchmarks), a
`core.training.run.TrainingRun` from a config and the caller's options, and what it owns
around the run (the trackers' reports, the grading server)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from core.config import TrainConfig
from core.graders import GraderOptions
from core.parallel.distributed import World
from core.tracking import TrackingOptions
from core.training.callbacks import TrainerCallback
from core.training.devices import build_optimizer, resolve_device
from core.training.reporting import ReportingCallback, tracking_for
from core.training.run import TrainingRun, TrainResult
from core.training.update import group_advantages

__all__ = [
    "TrainResult",
    "TrainerCallback",
    "TrainingRun",
    "build_optimizer",
    "group_advantages",
    "resolve_device",
    "train",
]
"""What callers import from here (besides `train`), wherever it lives."""


def train(
    config: TrainConfig,
    out_dir: Path,
    *,
    callback: TrainerCallback | None = None,
    resume: bool = False,
    data_roots: Sequence[str] | None = None,
    file_paths: Mapping[str, Path] | None = None,
    model_dir: Path | None = None,
    world: World | None = None,
    tracking: TrackingOptions | None = None,
    grader_options: GraderOptions | None = None,
) -> TrainResult:
    """Run (or, with resume=True, continue from the latest checkpoint in out_dir) a training run.

    `world`: this process's rank when the run is data-parallel (`core.parallel.distributed`): every
    rank calls `train` with the same config and out_dir; each trains on its share of every step's
    groups, and rank 0 alone writes (metrics, checkpoints, results, the final model) and reports
    through its callback. A stop is agreed at step boundaries (and between warm-up steps): all
    ranks stop together, and the checkpoint keeps what they trained
    (`core.training.callbacks.Stop`).
    `data_roots`: the only folders local models and datasets may be read from, symlinks resolved
    (a service passes its operator's roots; None, for a local run, allows any path).
    `file_paths`: local paths of the uploaded files the spec names, by file id (the worker's).
    `model_dir`: the final-model folder a `model.name: job:<id>` stands for (the worker's).
    `tracking`: where the trackers of `config.report_to` report, and the operator's own
    (`core.tracking.TrackingOptions`; None: each tracker's defaults, TensorBoard under
    `out_dir`); rank 0 alone reports, off the training thread (`core.training.reporting`).
    `grader_options`: what the operator lets OpenAI graders do (`core.graders.GraderOptions`;
    None: no python, no score_model)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank0 = world is None or world.rank == 0
    reporting = tracking_for(config, tracking) if rank0 else None
    inner = callback or TrainerCallback()
    # a run that reports nowhere keeps its caller's callback as it is
    cb = ReportingCallback(inner) if reporting is not None else inner
    run = TrainingRun(
        cfg=config,
        out_dir=out_dir,
        callback=cb,
        data_roots=data_roots,
        file_paths=file_paths,
        model_dir=model_dir,
        world=world,
        grader_options=grader_options,
    )
    try:
        return run.train(resume, reporting)
    finally:
        try:
            if isinstance(cb, ReportingCallback):
                cb.close()  # the trackers' last reports, for a bounded time
        finally:
            try:
                run.close()  # its rollout server, if it has one
            finally:
                run.task.close()  # its grading server, if it has one
