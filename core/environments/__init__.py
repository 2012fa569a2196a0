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

The package: the protocol in `base`, environments by name in `registry`, the Hermes tool-call
format in `tools`, the `calculator` environment, and `task`, the trainer's task of a
`task.name: environment` spec. Imports: `core.tasks` (the task row), `core.config` (the
environment's section). No model, no torch: environments are plain Python.
"""

from core.environments.base import (
    Done,
    Environment,
    Episode,
    EpisodeLimits,
    Observation,
    Turn,
)
from core.environments.registry import (
    EnvironmentFactory,
    environment_names,
    make_environment,
    register_environment,
)

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
