"""The `task.environment` section: a multi-turn environment by name, its args, and the limits
of each episode (`core.environments`, `core.rollout.episodes`). Pydantic only, like every
section; which names exist is the trainer's to check (`core.environments.make_environment`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, JsonValue

from core.config.types import FINITE, Strict

EnvironmentArgs = Annotated[
    dict[Annotated[str, Field(max_length=100)], JsonValue], Field(max_length=64)
]


class EnvironmentConfig(Strict):
    name: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")] = (
        Field(description="The environment, e.g. 'calculator' (core.environments).")
    )
    args: EnvironmentArgs = Field(
        default_factory=dict, description="The environment's own arguments."
    )
    max_turns: int = Field(
        default=4,
        ge=1,
        le=64,
        description=(
            "Model turns per episode; an episode still going after the last one scores 0 and "
            "counts in env_turn_limits."
        ),
    )
    max_tokens: int = Field(
        default=256,
        ge=1,
        le=32768,
        description=(
            "Tokens per episode after the prompt, sampled and inserted; an observation that "
            "leaves no room for another turn ends the episode with 0 (env_token_limits). Each "
            "turn samples at most rollout.max_new_tokens of them."
        ),
    )
    step_timeout_seconds: Annotated[float, Field(gt=0, le=600), FINITE] = Field(
        default=10.0,
        description=(
            "Time limit of each call into the environment (an episode's start and each step); "
            "past it the episode scores 0 and counts in env_timeouts. One that raises scores "
            "0 and counts in env_errors."
        ),
    )
