"""`task.name: environment`: the task rows and limits of a multi-turn environment, for the
trainer to play episodes on (`core.rollout.episodes`); rewards are the episodes', not a grader's.
Built by the trainer (`core.training.run`), not by `core.tasks.make_task`: environments read the
task row (`core.tasks.base`), so the tasks package cannot import them back.
"""

from __future__ import annotations

import random

from core.config import TaskConfig
from core.environments.base import Environment, EpisodeLimits
from core.environments.registry import make_environment
from core.tasks.base import Example, Task


class EnvironmentTask(Task):
    """The environment `cfg.environment` names. It has no held-out set yet (an evaluation
    would play episodes too) and no single-completion score."""

    def __init__(self, cfg: TaskConfig) -> None:
        env_cfg = cfg.environment
        if env_cfg is None:
            raise ValueError("task.name='environment' needs task.environment")
        self.environment: Environment = make_environment(env_cfg.name, env_cfg.args)
        self.name = f"environment:{env_cfg.name}"
        self.limits = EpisodeLimits(
            max_turns=env_cfg.max_turns,
            max_tokens=env_cfg.max_tokens,
            step_timeout=env_cfg.step_timeout_seconds,
        )

    def sample(self, rng: random.Random) -> Example:
        return self.environment.sample(rng)

    def score(self, example: Example, completion: str) -> float:
        raise TypeError(
            f"{self.name} scores whole episodes (core.rollout.episodes), not one completion"
        )
