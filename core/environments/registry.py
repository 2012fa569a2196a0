"""Environments by the name a job spec gives them (`task.environment.name`): the built-in ones
and any an operator's code registers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from core.environments.base import Environment
from core.environments.calculator import CalculatorEnvironment

EnvironmentFactory = Callable[[Mapping[str, Any]], Environment]

_REGISTRY: dict[str, EnvironmentFactory] = {"calculator": CalculatorEnvironment}


def register_environment(name: str, factory: EnvironmentFactory) -> None:
    """Makes `factory(args)` the environment `task.environment.name: <name>` builds, beside
    the built-in ones (`calculator`): for an operator's code, and for tests."""
    _REGISTRY[name] = factory


def environment_names() -> list[str]:
    return sorted(_REGISTRY)


def make_environment(name: str, args: Mapping[str, Any]) -> Environment:
    """The environment `name` with its `args`; ValueError naming the known ones."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"task.environment.name={name!r} is not an environment here (known: "
            f"{', '.join(environment_names())})"
        )
    return factory(args)
