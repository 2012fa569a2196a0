"""Tasks with verifiable rewards in [0, 1]: built-in digit tasks and JSONL datasets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from core.config import TaskConfig
from core.tasks.base import Example, Task, positional_credit
from core.tasks.builtin import ArithmeticTask, DigitStringTask
from core.tasks.jsonl import JsonlTask

__all__ = ["Example", "Task", "make_task", "positional_credit"]


def make_task(
    cfg: TaskConfig,
    data_roots: Sequence[str] | None = None,
    file_paths: Mapping[str, Path] | None = None,
) -> Task:
    """The task `cfg` names. `data_roots`: the folders a dataset file (`task.path`) must lie
    under once symlinks are resolved; the service passes its PDPPO_DATA_ROOTS, a local
    `pdppo train` passes None (no restriction). `file_paths`: where the worker put the uploaded
    files the spec names (`task.file`, `task.validation_file`), by file id; they come from the
    artifact store, not from the data roots."""
    if cfg.name == "jsonl":
        assert cfg.path is not None  # the config validator guarantees it
        return JsonlTask(cfg.path, cfg.match, cfg.numeric_tolerance, data_roots=data_roots)
    if cfg.name == "arithmetic":
        return ArithmeticTask(cfg.min_len, cfg.max_len)
    return DigitStringTask(cfg.name, cfg.min_len, cfg.max_len)
