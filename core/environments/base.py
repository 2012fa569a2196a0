"""The environment protocol (`core.environments`): the model's `Turn`, the environment's
`Observation` or `Done`, the `Episode` and `Environment` that produce them, the driver's
`EpisodeLimits`."""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.tasks.base import Example, Message


@dataclass(frozen=True)
class Turn:
    """The model's turn as sampled: `ids` the sampled token ids (the EOS included when the turn
    ended on it), `text` their decoding without special tokens, `complete` whether it ended at
    EOS (False: cut by a token limit), `index` its number in the episode (0 first)."""

    ids: tuple[int, ...]
    text: str
    complete: bool
    index: int


@dataclass(frozen=True)
class Observation:
    """What the environment inserts before the model's next turn: `ids`, token ids inserted
    exactly as given, or `messages`, chat turns (`{"role": "tool", "content": ...}`) rendered
    with the model's chat template up to the assistant's next header. Exactly one of the two."""

    ids: tuple[int, ...] | None = None
    messages: tuple[Message, ...] | None = None

    def __post_init__(self) -> None:
        if (self.ids is None) == (self.messages is None):
            raise ValueError("an Observation holds exactly one of ids and messages")


@dataclass(frozen=True)
class Done:
    """The end of the episode: its reward in [0, 1] and what the environment wants to report
    about it (shown in samples, not trained on)."""

    reward: float
    info: Mapping[str, Any] = field(default_factory=dict)


class Episode(abc.ABC):
    """One episode's state: the environment's answer to each of the model's turns."""

    @abc.abstractmethod
    def step(self, turn: Turn) -> Observation | Done:
        """The environment's answer to `turn`. May raise or hang: the driver ends the episode
        with reward 0 and counts it (`env_errors`, `env_timeouts`)."""


class Environment(abc.ABC):
    """A source of task rows and the episodes played on them. `name`: what the job spec calls
    it (`task.environment.name`)."""

    name: str

    @abc.abstractmethod
    def sample(self, rng: random.Random) -> Example:
        """One task row, drawn from `rng` only (reproducible runs): its `messages` are the
        episode's prompt."""

    @abc.abstractmethod
    def start(self, example: Example) -> Episode:
        """A new episode on `example` (every episode of a GRPO group starts from the same
        row). May raise or hang, like `Episode.step`."""


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits the driver enforces: `max_turns` model turns, `max_tokens` tokens
    after the prompt (sampled and inserted), `step_timeout` seconds for each environment call
    (`start` and every `step`)."""

    max_turns: int = 4
    max_tokens: int = 256
    step_timeout: float = 10.0
