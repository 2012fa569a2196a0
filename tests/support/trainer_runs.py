"""Runs of the trainer on the built-in tiny model that several test files share: a small
config, the metrics a run wrote, a callback that records (and can stop) a run, and tasks whose
rewards are fixed so that a test controls the advantages."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.config import TrainConfig
from core.tasks import Example, Grades, Task
from core.training.trainer import TrainerCallback

TIMING = {"tokens_per_s", "rollout_time", "update_time", "step_time"}
"""Metrics that measure time: they differ between two runs of the same steps."""


def small_config(**overrides: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}},
        "task": {"name": "reverse", "min_len": 2, "max_len": 3},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "algorithm": {"mask": "predictive", "top_k": 8, "minibatches": 2},
        "optim": {"lr": 3e-3},
        "steps": 4,
        "checkpoint_every": 2,
        "seed": 0,
        "device": "cpu",
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return TrainConfig.model_validate(data)


def read_metrics(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


class Recorder(TrainerCallback):
    def __init__(self, stop_after: int | None = None) -> None:
        self.steps: list[int] = []
        self.checkpoints: list[int] = []
        self.stop_after = stop_after

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        assert not self.checkpoints or self.checkpoints[-1] < step  # on_step before checkpoint
        self.steps.append(step)

    def on_checkpoint(self, step: int, path: Path) -> None:
        assert path.is_dir()
        self.checkpoints.append(step)

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.steps) >= self.stop_after


def strip_timing(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


class ZeroReward(Task):
    """A built-in task whose grader never matches: every reward 0, as with a free-form dataset
    and an untrained model."""

    def __init__(self, inner: Task) -> None:
        self.inner = inner
        self.name = inner.name

    def sample(self, rng: random.Random) -> Example:
        return self.inner.sample(rng)

    def score(self, example: Example, completion: str) -> float:
        return 0.0

    def grade(self, examples: Sequence[Example], completions: Sequence[str]) -> Grades:
        return Grades([0.0] * len(examples), {"grader/never": 0.0, "grader_errors": 0.25})

    def warmup_completion(self, example: Example, rng: random.Random) -> str:
        return self.inner.warmup_completion(example, rng)


class SpreadReward(ZeroReward):
    """A built-in task graded by the length of the decoded completion: an untrained model's
    completions differ in it (half the byte vocabulary decodes to nothing), so groups have a
    spread of rewards from the first step whatever the sampler draws, where the task's own
    digits are a lucky hit or two in a few hundred tokens."""

    def grade(self, examples: Sequence[Example], completions: Sequence[str]) -> Grades:
        return Grades([min(len(c), 4) / 4 for c in completions], {})
