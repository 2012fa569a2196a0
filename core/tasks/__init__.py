"""Tasks with verifiable rewards in [0, 1]: built-in digit tasks, JSONL datasets and
reasoning-gym's procedural datasets.

Imports: `core.config`, `core.disk` (a dataset file read safely), `core.graders` (a JSONL task's
grader), `core.extras` (reasoning-gym is the `reasoning` extra, imported when such a task is
built).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from core.config import TaskConfig
from core.graders import GraderOptions
from core.tasks.base import Example, Grades, Task, positional_credit
from core.tasks.builtin import ArithmeticTask, DigitStringTask
from core.tasks.jsonl import JsonlTask
from core.tasks.reasoning_gym import ReasoningGymTask

__all__ = [
    "Example",
    "Grades",
    "JsonlTask",
    "ReasoningGymTask",
    "Task",
    "make_task",
    "positional_credit",
]


def make_task(
    cfg: TaskConfig,
    data_roots: Sequence[str] | None = None,
    file_paths: Mapping[str, Path] | None = None,
    *,
    seed: int = 0,
    grader_options: GraderOptions | None = None,
) -> Task:
    """The task `cfg` names. `data_roots`: the folders a dataset file (`task.path`) must lie
    under once symlinks are resolved; the service passes its PDPPO_DATA_ROOTS, a local
    `pdppo train` passes None (no restriction). `file_paths`: where the worker put the uploaded
    files the spec names (`task.file`, `task.validation_file`), by file id; they come from the
    artifact store, not from the data roots; a file id missing from it is a ValueError. `seed`
    (the run's): which records `task.validation_fraction` holds out. `grader_options`: what the
    operator lets OpenAI graders do (None: no python, no score_model); a reasoning_gym task
    without `task.seed` generates its rows with `seed`.

    A JSONL task with a grader that runs in the grading server holds a child process once it
    has graded: call its `close()` when the run ends (it is also stopped at exit)."""
    if cfg.name == "jsonl":
        return JsonlTask.from_config(
            cfg, data_roots, file_paths, seed=seed, grader_options=grader_options
        )
    if cfg.name == "environment":
        raise ValueError(
            "task.name='environment' is played in episodes: core.environments.task builds it"
        )
    if cfg.name == "reasoning_gym":
        return ReasoningGymTask(cfg, run_seed=seed)
    if cfg.name == "arithmetic":
        return ArithmeticTask(cfg.min_len, cfg.max_len)
    return DigitStringTask(cfg.name, cfg.min_len, cfg.max_len)
