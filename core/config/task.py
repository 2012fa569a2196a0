"""The `task` section of the trainer's configuration: which verifiable task, or which dataset and
grader, and the supervised warm-up. Kept apart from `core.config` (which re-exports it) because
it is the section users' own data goes through; the same strict rules apply (`core.config`'s
docstring).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from core.config.environment import EnvironmentConfig
from core.config.graders import GraderConfig
from core.config.reasoning_gym import DatasetConfig, DatasetName, WeightedDataset, check_dataset
from core.config.types import FINITE, NO_CONTROL_CHARS, FiniteFloat, Strict

MAX_PATH_CHARS = 4096
"""Longest model name or dataset path (Linux PATH_MAX)."""

FILE_ID_RE = re.compile(r"file-[0-9a-f]{32}")
"""An uploaded file's id: `file-` and the first 32 hex digits of its sha256."""


TaskName = Literal["arithmetic", "sort", "copy", "reverse", "jsonl", "reasoning_gym", "environment"]

BUILTIN_TASKS = ("arithmetic", "sort", "copy", "reverse")
"""The digit tasks of `core.tasks.builtin`: prompts of a known format, no data."""

REASONING_GYM_FIELDS = ("dataset", "config", "datasets", "size", "seed", "validation_size")
"""The fields only `name: reasoning_gym` reads (`system_prompt` too)."""


class TaskConfig(Strict):
    name: TaskName = Field(
        default="reverse",
        description=(
            "Built-in verifiable task, 'jsonl' for a dataset of {prompt, answer}, or "
            "'reasoning_gym' for rows a reasoning-gym dataset generates (the `reasoning` extra), "
            "'environment' for multi-turn episodes with a task.environment (tools, scored at "
            "the end)."
        ),
    )
    min_len: int = Field(
        default=2,
        ge=1,
        le=32,
        description="Shortest digit string (sort/copy/reverse) or operand digits.",
    )
    max_len: int = Field(
        default=4,
        ge=1,
        le=32,
        description="Longest digit string (sort/copy/reverse) or operand digits.",
    )
    path: Annotated[str, Field(max_length=MAX_PATH_CHARS), NO_CONTROL_CHARS] | None = Field(
        default=None,
        description=(
            "JSONL file on the worker's disk (under its data roots), one record per line: "
            '{"prompt": ...} or {"messages": [...]}, plus any fields the grader reads.'
        ),
    )
    file: Annotated[str, Field(pattern=FILE_ID_RE.pattern)] | None = Field(
        default=None,
        description="An uploaded dataset (`POST /v1/files`) by id; instead of `path`.",
    )
    validation_path: Annotated[str, Field(max_length=MAX_PATH_CHARS), NO_CONTROL_CHARS] | None = (
        Field(default=None, description="Held-out JSONL records for evaluation, on disk.")
    )
    validation_file: Annotated[str, Field(pattern=FILE_ID_RE.pattern)] | None = Field(
        default=None, description="Held-out JSONL records for evaluation, an uploaded file id."
    )
    validation_fraction: Annotated[float, Field(ge=0, le=0.5), FINITE] = Field(
        default=0.0,
        description=(
            "Without a validation file: hold out this fraction of the dataset (chosen by the "
            "seed) for evaluation."
        ),
    )
    grader: GraderConfig | None = Field(
        default=None,
        description=(
            "How JSONL completions are scored (`{type: ...}`: string_check, regex, numeric, "
            "math, json_schema, length_penalty, plugin, multi); unset: `match` on `answer`."
        ),
    )
    grader_timeout_seconds: Annotated[float, Field(gt=0, le=600), FINITE] = Field(
        default=5.0,
        description=(
            "Time limit to grade one completion; past it the completion scores 0 and counts "
            "in the metric grader_timeouts."
        ),
    )
    grader_batch_timeout_seconds: Annotated[float, Field(gt=0, le=3600), FINITE] = Field(
        default=120.0,
        description=(
            "Time limit to grade one step's completions: a grader that hangs on every one "
            "costs a step this long at most (the ones left score 0, counted as timeouts)."
        ),
    )
    match: Literal["exact", "numeric", "regex"] = Field(
        default="exact",
        description=(
            "JSONL scoring: exact string match, numeric match (within tolerance), or the "
            "answer is a regex that must fully match the stripped completion."
        ),
    )
    numeric_tolerance: FiniteFloat = Field(
        default=1e-6, ge=0, le=1e12, description="Absolute tolerance for 'numeric'."
    )
    dataset: DatasetName | None = Field(
        default=None,
        description="reasoning_gym: the dataset (e.g. basic_arithmetic); or task.datasets.",
    )
    config: DatasetConfig | None = Field(
        default=None,
        description="reasoning_gym: the dataset's config keys (its config class's fields).",
    )
    datasets: Annotated[list[WeightedDataset], Field(min_length=1, max_length=64)] | None = Field(
        default=None,
        description=(
            "reasoning_gym: several datasets, [{name, weight, config}], rows drawn by weight "
            "(reasoning-gym's CompositeDataset); instead of task.dataset."
        ),
    )
    size: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="reasoning_gym: training rows generated when the job starts (default 1000).",
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="reasoning_gym: the training rows' seed (default: the run's train.seed).",
    )
    validation_size: int | None = Field(
        default=None,
        ge=0,
        le=10_000,
        description=(
            "reasoning_gym: held-out rows for evaluation (default 100), generated with another "
            "seed, none of them a training row's question."
        ),
    )
    system_prompt: Annotated[str, Field(min_length=1, max_length=20_000)] | None = Field(
        default=None,
        description="reasoning_gym: a system turn before each question (chat models).",
    )
    environment: EnvironmentConfig | None = Field(
        default=None,
        description=(
            "environment: the multi-turn environment ({name, args, max_turns, max_tokens, "
            "step_timeout_seconds}); its rows are the prompts, its reward the episode's."
        ),
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description=(
            "Supervised warm-up steps before RL, on what task.warmup_target says. 0 disables."
        ),
    )
    warmup_target: Literal["format", "answer"] = Field(
        default="format",
        description=(
            "What the warm-up teaches: 'format' = answer-shaped random digits (RL learns the "
            "whole task; built-in tasks only), 'answer' = the true answers (a partial head start "
            "that RL improves; for jsonl, every record's 'answer')."
        ),
    )
    warmup_lr: FiniteFloat = Field(
        default=3e-3, gt=0, le=1, description="Learning rate of the warm-up."
    )
    warmup_batch_size: int = Field(
        default=32, ge=1, le=65536, description="Examples per warm-up step."
    )

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"task.min_len={self.min_len} must be <= task.max_len={self.max_len}")
        if self.name == "jsonl" and (self.path is None) == (self.file is None):
            raise ValueError(
                "task.name='jsonl' needs exactly one of task.path (a file on the worker) and "
                "task.file (an uploaded file id)"
            )
        if self.validation_path is not None and self.validation_file is not None:
            raise ValueError("set task.validation_path or task.validation_file, not both")
        held_out = self.validation_path is not None or self.validation_file is not None
        if held_out and self.validation_fraction:
            raise ValueError(
                "task.validation_fraction splits the dataset; it cannot be combined with a "
                "validation file"
            )
        if self.name != "jsonl":
            for name in ("file", "validation_path", "validation_file", "grader"):
                if getattr(self, name) is not None:
                    raise ValueError(f"task.{name} is only used when task.name='jsonl'")
            if self.validation_fraction:
                raise ValueError("task.validation_fraction is only used when task.name='jsonl'")
        self._check_reasoning_gym()
        if (self.name == "environment") != (self.environment is not None):
            raise ValueError("task.environment goes with task.name='environment', and only with it")
        if self.name == "environment" and self.warmup_steps:
            raise ValueError("task.name='environment' has no supervised warm-up (warmup_steps)")
        if self.name in ("jsonl", "reasoning_gym") and (
            self.warmup_steps and self.warmup_target == "format"
        ):
            raise ValueError(
                f"task.warmup_steps={self.warmup_steps} with task.warmup_target='format': a "
                "dataset has no answer shape to imitate; use warmup_target='answer' (records "
                "with an 'answer') or a built-in task"
            )
        if self.name != "jsonl" and self.path:
            raise ValueError(f"task.path={self.path!r} is only used when task.name='jsonl'")
        return self

    def _check_reasoning_gym(self) -> None:
        """The datasets and config keys by name (`core.config.reasoning_gym`); their values'
        own rules need the package (`core.tasks.reasoning_gym.check_values`)."""
        if self.name != "reasoning_gym":
            for name in (*REASONING_GYM_FIELDS, "system_prompt"):
                if getattr(self, name) is not None:
                    raise ValueError(f"task.{name} is only used when task.name='reasoning_gym'")
            return
        if (self.dataset is None) == (self.datasets is None):
            raise ValueError(
                "task.name='reasoning_gym' needs exactly one of task.dataset (one dataset, its "
                "keys in task.config) and task.datasets (several, weighted)"
            )
        if self.datasets is not None:
            if self.config is not None:
                raise ValueError(
                    "task.config goes with task.dataset; with task.datasets each entry has its "
                    "own config"
                )
            names = [d.name for d in self.datasets]
            for i, entry in enumerate(self.datasets):
                check_dataset(entry.name, entry.config, f"task.datasets[{i}]")
                if entry.name in names[:i]:
                    raise ValueError(
                        f"task.datasets[{i}].name={entry.name!r} is named twice; a dataset is "
                        "listed once (reasoning-gym's CompositeDataset)"
                    )
        else:
            assert self.dataset is not None
            check_dataset(self.dataset, self.config or {}, "task")
