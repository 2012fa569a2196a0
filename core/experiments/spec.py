"""An experiment's spec and the child jobs it stands for.

An experiment is a base job spec, a grid of values for some of its `train` fields and a number of
seeds. Every arm (one point of the grid) runs every seed, and seed s of one arm differs from seed
s of another only in the arm's overrides: the same prompts, data order and initial weights. That
pairing is what lets `stats.report` compare arms seed by seed, where the spread between seeds is
often larger than the gap between arms.

Grid paths are checked here against `TrainConfig`'s fields, so that a typo is refused before any
child exists; whether the values are valid is the job admission's call (it validates each
`child_spec` as it would a submitted job, and names the arm and seed it refuses).
"""

from __future__ import annotations

import copy
import itertools
import json
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.config import MAX_SEED, TrainConfig
from core.config.types import NO_CONTROL_CHARS

__all__ = ["MAX_ARMS", "Arm", "ExperimentSpec", "arms", "child_spec", "seed_list"]

MAX_AXES = 4
MAX_VALUES = 16
MAX_ARMS = 64
MAX_SEEDS = 64
# The job name limit of `pdppo.spec.JobSpec` (core/ does not import pdppo): a child's name is cut
# to it rather than refused, since the experiment's name alone may come close to it.
JOB_NAME_LIMIT = 200


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    """The config models a field's annotation can hold: `X`, `X | None`, `Annotated[A | B, ...]`
    (a discriminated union of graders holds several)."""
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _models_of(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in typing.get_args(annotation) for m in _models_of(arg)]
    return []


def check_path(path: str) -> None:
    """Refuse a dotted path (under `train`) that does not name a field of `TrainConfig` or of one
    of its nested models. In a union (`task.grader`), a field of any member counts."""
    models: list[type[BaseModel]] = [TrainConfig]
    walked: list[str] = []
    for part in path.split("."):
        fields = {name: m.model_fields[name] for m in models for name in m.model_fields}
        if part not in fields:
            where = f"train.{'.'.join(walked)}" if walked else "train"
            known = ", ".join(sorted(fields)) or "none (not a section)"
            raise ValueError(f"{path!r}: {where} has no field {part!r} (its fields: {known})")
        walked.append(part)
        models = [
            m
            for model in models
            if part in model.model_fields
            for m in _models_of(model.model_fields[part].annotation)
        ]


def _label(value: Any) -> str:
    """A value as an arm name shows it: strings bare, everything else as JSON (0.2, true, null)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class ExperimentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=100), NO_CONTROL_CHARS] | None = Field(
        default=None, description="Human label; each child job is named `<name>/<arm>/seed<s>`."
    )
    base: dict[str, Any] = Field(
        description="A whole job spec as POST /v1/jobs takes it (`name`, `resources`, `train`)."
    )
    grid: dict[str, list[Any]] = Field(
        description=(
            "Spec paths under `train` (`algorithm.mask`; a leading `train.` is accepted), each "
            "with the values to try: 1 to 4 axes, 1 to 16 distinct values each, at most 64 arms "
            "(the product). `seed` is not an axis: it is the experiment's own."
        ),
    )
    seeds: int = Field(
        default=4,
        ge=1,
        le=MAX_SEEDS,
        description="Seeds per arm: the base's train.seed (default 0) and the ones after it.",
    )
    baseline: str | None = Field(
        default=None, description="The arm the others are compared with; default: the first arm."
    )

    @field_validator("base")
    @classmethod
    def _base_has_train(cls, base: dict[str, Any]) -> dict[str, Any]:
        train = base.get("train")
        if not isinstance(train, dict):
            raise ValueError("base must be a job spec with a `train` mapping")
        seed = train.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"base train.seed must be an integer (got {seed!r})")
        name = base.get("name")
        if name is not None and not isinstance(name, str):
            raise ValueError(f"base name must be a string (got {name!r})")
        return base

    @field_validator("grid")
    @classmethod
    def _grid_paths(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not 1 <= len(grid) <= MAX_AXES:
            raise ValueError(f"grid needs 1 to {MAX_AXES} axes (got {len(grid)})")
        out: dict[str, list[Any]] = {}
        for raw, values in grid.items():
            path = raw.removeprefix("train.")
            if path == "seed":
                raise ValueError(
                    f"{raw!r} cannot be an axis: every arm runs the experiment's seeds (`seeds`)"
                )
            check_path(path)
            if path in out:
                raise ValueError(f"{raw!r}: axis {path!r} given twice")
            if not 1 <= len(values) <= MAX_VALUES:
                raise ValueError(f"{raw!r}: 1 to {MAX_VALUES} values (got {len(values)})")
            seen: set[str] = set()
            for value in values:
                try:
                    key = json.dumps(value, sort_keys=True, allow_nan=False)
                except (TypeError, ValueError):
                    raise ValueError(f"{raw!r}: {value!r} is not a JSON value") from None
                if key in seen:
                    raise ValueError(f"{raw!r}: value {value!r} given twice")
                seen.add(key)
            out[path] = values
        for a, b in itertools.permutations(out, 2):
            if b.startswith(a + "."):
                raise ValueError(f"axes {a!r} and {b!r} overlap: {a!r} holds {b!r}")
        n_arms = 1
        for values in out.values():
            n_arms *= len(values)
        if n_arms > MAX_ARMS:
            raise ValueError(f"the grid makes {n_arms} arms, more than {MAX_ARMS}")
        return out

    @model_validator(mode="after")
    def _arms_and_seeds(self) -> ExperimentSpec:
        names = [arm.name for arm in arms(self)]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"two arms would both be named {dup!r}: make the values distinct")
        if self.baseline is not None and self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not an arm (arms: {', '.join(names)})")
        last = seed_list(self)[-1]
        if last > MAX_SEED:
            raise ValueError(f"seeds run to {last}, past train.seed's limit {MAX_SEED}")
        return self

    @property
    def baseline_arm(self) -> str:
        return self.baseline if self.baseline is not None else arms(self)[0].name


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: dict[str, Any]


def _axis_labels(paths: list[str]) -> list[str]:
    """Each axis's last path segment, or its full path where another axis ends the same way."""
    last = [p.rpartition(".")[2] for p in paths]
    return [p if last.count(seg) > 1 else seg for p, seg in zip(paths, last, strict=True)]


def arms(spec: ExperimentSpec) -> list[Arm]:
    """The grid's cartesian product, first axis slowest (the order the grid was written in)."""
    paths = list(spec.grid)
    labels = _axis_labels(paths)
    return [
        Arm(
            name=",".join(f"{label}={_label(v)}" for label, v in zip(labels, combo, strict=True)),
            overrides=dict(zip(paths, combo, strict=True)),
        )
        for combo in itertools.product(*spec.grid.values())
    ]


def seed_list(spec: ExperimentSpec) -> list[int]:
    start: int = spec.base["train"].get("seed", 0)
    return [start + i for i in range(spec.seeds)]


def child_spec(spec: ExperimentSpec, arm: Arm, seed: int) -> dict[str, Any]:
    """The job spec of one (arm, seed): the base with the arm's values set, sections created
    where the base leaves them to their defaults. The base is not touched."""
    child = copy.deepcopy(spec.base)
    train = child["train"]
    for path, value in arm.overrides.items():
        *sections, leaf = path.split(".")
        node = train
        for section in sections:
            inner = node.get(section)
            if not isinstance(inner, dict):  # absent, or None (an optional section left off)
                inner = node[section] = {}
            node = inner
        node[leaf] = copy.deepcopy(value)
    train["seed"] = seed
    prefix = spec.name or child.get("name") or "experiment"
    child["name"] = f"{prefix}/{arm.name}/seed{seed}"[:JOB_NAME_LIMIT]
    return child
