"""The `task.name: reasoning_gym` part of the task section: which reasoning-gym datasets, with
which config keys, checked by name against the shipped catalogue (`reasoning_gym_catalog`).

Names, keys and value types are checked here, with pydantic only, so that the API, `pdppo
submit --dry-run` and `pdppo train` refuse a misspelt dataset or key with the close names even
where the `reasoning` extra is not installed (the API's `server` extra does not bring it: the
package pulls sympy and matplotlib, about 150 MB). What a dataset's own config class rejects
(a range, two fields that disagree) needs the package: `core.tasks.reasoning_gym.check_values`.
tests/core/test_reasoning_gym.py holds the catalogue equal to the installed package's.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field, JsonValue

from core.config.reasoning_gym_catalog import CATALOG, Kind
from core.config.types import FINITE, Strict

DatasetName = Annotated[str, Field(min_length=1, max_length=100)]
DatasetConfig = Annotated[
    dict[Annotated[str, Field(max_length=100)], JsonValue], Field(max_length=64)
]
"""A dataset's config keys (its config class's fields) and JSON values."""

RESERVED_KEYS = {"seed": "task.seed", "size": "task.size"}
"""Config fields every dataset has, set from the task's own fields (which the held-out split
needs to know), never from `config`."""

MAX_LISTED_CLOSE = 3

DEFAULT_SIZE = 1000
"""Training rows when `task.size` is not set."""
DEFAULT_VALIDATION_SIZE = 100
"""Held-out rows when `task.validation_size` is not set."""


class WeightedDataset(Strict):
    """One dataset of `task.datasets`: rows are drawn from it in proportion to `weight`
    (reasoning-gym's `CompositeDataset`)."""

    name: DatasetName = Field(description="A reasoning-gym dataset, e.g. basic_arithmetic.")
    weight: Annotated[float, Field(gt=0, le=1e6), FINITE] = Field(
        default=1.0, description="Relative share of the rows drawn from this dataset."
    )
    config: DatasetConfig = Field(
        default_factory=dict, description="The dataset's config keys (its config class's fields)."
    )


def dataset_names() -> list[str]:
    return sorted(CATALOG)


def close_names(name: str, known: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(name, list(known), n=MAX_LISTED_CLOSE, cutoff=0.6)


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = close_names(name, known)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def check_dataset(name: str, config: Mapping[str, Any], where: str) -> None:
    """ValueError naming the first unknown dataset, unknown key or value of the wrong type, with
    the close names and the valid ones; `where` is the spec path of the entry
    (`task` or `task.datasets[1]`)."""
    name_field = "dataset" if where == "task" else "name"
    if name not in CATALOG:
        close = _did_you_mean(name, dataset_names())
        listed = "" if close else f" (the datasets: {', '.join(dataset_names())})"
        raise ValueError(
            f"{where}.{name_field}={name!r} is not a reasoning-gym dataset{close}{listed}"
        )
    fields = CATALOG[name]
    for key, value in config.items():
        if key in RESERVED_KEYS:
            raise ValueError(
                f"{where}.config.{key}: set {RESERVED_KEYS[key]} instead (the training rows and "
                "the held-out rows are generated from it)"
            )
        if key not in fields:
            raise ValueError(
                f"{where}.config.{key}: {name} has no such key{_did_you_mean(key, list(fields))} "
                f"(its keys: {', '.join(fields)})"
            )
        problem = _type_problem(fields[key], value)
        if problem is not None:
            raise ValueError(f"{where}.config.{key}: {name} takes {problem}, not {value!r}")


def _type_problem(kind: Kind, value: Any) -> str | None:
    """What `kind` takes when `value` is not one of it, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return "a finite number"
    if isinstance(kind, list):
        return None if value in kind else f"one of {kind}"
    if kind.endswith("?"):
        if value is None:
            return None
        kind = kind[:-1]
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "list": isinstance(value, list),
        "any": True,
    }[kind]
    if ok:
        return None
    return {"int": "an integer", "float": "a number", "bool": "true or false"}.get(
        kind, f"a {kind}"
    )
