"""Multi-turn environments: the model takes a turn, the environment answers (a tool's result, a
user's reply) or ends the episode with a reward.

The protocol is small on purpose (issue 54, item 2): an `Environment` draws task rows (`sample`)
and starts one `Episode` per row (`start`); the rollout driver (`core.rollout.episodes`) hands
each episode the model's turn, exactly as sampled (`Turn`: its token ids and their text), and
gets back either an `Observation` to insert before the model's next turn or `Done` with the
episode's reward in [0, 1]. An observation is token ids (inserted as given) or chat messages
(rendered with the model's own chat template, `core.environments.render`). Either way the
inserted tokens are masked out of the loss, and the trainer trains on the sampled ids
themselves, never on a re-encoding of the text.

Limits are the driver's (`EpisodeLimits`): turns, tokens and seconds per environment call. An
environment that raises or runs past its time ends its episode with reward 0 and is counted
(`env_errors`, `env_timeouts`); it never ends the job.

Imports: `core.tasks.base` (the task row), `core.config` (the environment's section). No model,
no torch: environments are plain Python.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Mapping
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


EnvironmentFactory = Callable[[Mapping[str, Any]], Environment]

_REGISTRY: dict[str, EnvironmentFactory] = {}


def register_environment(name: str, factory: EnvironmentFactory) -> None:
    """Makes `factory(args)` the environment `task.environment.name: <name>` builds. The
    built-in ones register themselves on import; an operator's code may add more."""
    _REGISTRY[name] = factory


def environment_names() -> list[str]:
    _builtins()
    return sorted(_REGISTRY)


def make_environment(name: str, args: Mapping[str, Any]) -> Environment:
    """The environment `name` with its `args`; ValueError naming the known ones."""
    _builtins()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"task.environment.name={name!r} is not an environment here (known: "
            f"{', '.join(environment_names())})"
        )
    return factory(args)


def _builtins() -> None:
    from core.environments import calculator  # registers itself

    del calculator


__all__ = [
    "Done",
    "Environment",
    "EnvironmentFactory",
    "Episode",
    "EpisodeLimits",
    "Observation",
    "Turn",
    "environment_names",
    "make_environment",
    "register_environment",
]
