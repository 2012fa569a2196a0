"""A task with a fixed held-out set and the small config the evaluation tests train with."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.config import TrainConfig
from core.tasks.base import Example, Grades
from core.tasks.builtin import DigitStringTask

DIGITS = ["12", "345", "67", "890", "21", "433"]


class HeldOutReverse(DigitStringTask):
    """The reverse task with a fixed held-out set, whose grader records what it was shown.

    Rewards come from a hash of the completion (0, 0.5 or 1): a spread of full, partial and no
    credit from an untrained model, so pass@k sees mixed prompts. The grader's own metric
    `grader/index` is the mean held-out index of the batch's prompts: its batch-size weighted
    mean over a whole evaluation is known in advance."""

    def __init__(self) -> None:
        super().__init__("reverse", 2, 3)
        self.held = [Example(f"reverse {d}=", d[::-1]) for d in DIGITS]
        self.graded: list[tuple[int, str, float]] = []  # held-out index, completion, reward

    def held_out(self) -> Sequence[Example]:
        return self.held

    def grade(self, examples: Sequence[Example], completions: Sequence[str]) -> Grades:
        rewards = [hash_reward(c) for c in completions]
        index = [self.held.index(e) if e in self.held else -1 for e in examples]
        self.graded += zip(index, completions, rewards, strict=True)
        return Grades(rewards, {"grader/index": sum(index) / len(index)})


def hash_reward(text: str) -> float:
    return [0.0, 0.5, 1.0][zlib.crc32(text.encode()) % 3]


def config(**overrides: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}},
        "task": {"name": "reverse", "min_len": 2, "max_len": 3},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "algorithm": {"top_k": 8, "minibatches": 2},
        "steps": 4,
        "checkpoint_every": 2,
        "seed": 0,
        "device": "cpu",
        "eval_samples": 4,
    }
    data.update(overrides)
    return TrainConfig.model_validate(data)


def run_config(tmp_path: Path, **overrides: Any) -> TrainConfig:
    data = tmp_path / "unused.jsonl"  # the config needs a held-out source; the fixture's task
    data.write_text('{"prompt": "p", "answer": "a"}\n')  # replaces the file's
    task = {"name": "jsonl", "path": str(data), "validation_fraction": 0.2}
    return config(task=task, **overrides)
