"""Procedural tasks from reasoning-gym (the `reasoning` extra): rows generated locally from a
dataset's config and a seed, scored by the dataset's own `score_answer`.

The training rows are `task.size` rows of the dataset (or of reasoning-gym's `CompositeDataset`
over `task.datasets`, weighted) with seed `task.seed`; the held-out rows (`held_out()`, for
evaluation) are generated with another seed, 2**30 away, so that no row comes from the same
random stream, and any row whose question is also a training row's is dropped: a small question
space (one-digit sums) would otherwise repeat training questions. Every row is generated when
the task is built, so a config that cannot generate fails before training.

Prompts are chat turns (an optional `task.system_prompt`, then the question) rendered with the
model's chat template where it has one, and the plain question elsewhere (`Example.chat_optional`).
A completion is scored as reasoning-gym's own training code scores it: the text of its last
`<answer>...</answer>` when it has one, else the whole stripped completion, through
`score_answer`. A scorer that raises costs that completion's reward (0) and counts in
`grader_errors`; scorers run in the trainer's process (they are the package's code, not a
tenant's), with no deadline.

`python -m core.tasks.reasoning_gym` rewrites `core/config/reasoning_gym_catalog.py` from the
installed package.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import enum
import math
import random
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.config import TaskConfig
from core.config.reasoning_gym import DEFAULT_SIZE, DEFAULT_VALIDATION_SIZE, WeightedDataset
from core.config.reasoning_gym_catalog import Kind
from core.extras import require
from core.tasks.base import Example, Grades, Task

EVAL_SEED_OFFSET = 2**30
"""How far the held-out rows' seed is from the training rows'. reasoning-gym draws row i of a
dataset seeded s from `Random(s + i)`: seeds closer than `task.size` would share streams."""

SEED_RANGE = 2**31
"""Seeds are taken modulo this (some generators seed numpy, which wants 32 bits)."""

HELD_OUT_TRIES = 20
"""Rows generated per held-out row wanted, at most, before the task says the question space is
too small for the split."""


def _require() -> None:
    require("task.name='reasoning_gym'", "reasoning", ("reasoning_gym",))


def _entries(cfg: TaskConfig) -> list[WeightedDataset]:
    if cfg.datasets:
        return list(cfg.datasets)
    assert cfg.dataset is not None  # TaskConfig's check
    return [WeightedDataset(name=cfg.dataset, config=dict(cfg.config or {}))]


def _where(cfg: TaskConfig, i: int) -> str:
    return f"task.datasets[{i}]" if cfg.datasets else "task"


def row_seed(cfg: TaskConfig, run_seed: int) -> int:
    """The training rows' seed: `task.seed`, else the run's."""
    return (cfg.seed if cfg.seed is not None else run_seed) % SEED_RANGE


def _coerce(tp: Any, value: Any) -> Any:
    """A JSON value as the config class's field wants it: a tuple, an enum member, a date or
    time (ISO text), a nested config object."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return value if value is None or len(rest) != 1 else _coerce(rest[0], value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is datetime.date and isinstance(value, str):
        return datetime.date.fromisoformat(value)
    if tp is datetime.time and isinstance(value, str):
        return datetime.time.fromisoformat(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return tp(**value)
    if (tp is tuple or origin is tuple) and isinstance(value, list):
        return tuple(value)
    if origin is list and isinstance(value, list) and args:
        return [_coerce(args[0], v) for v in value]
    return value


def _config_object(
    name: str, config: Mapping[str, Any], where: str, *, seed: int, size: int
) -> Any:
    """The dataset's config class built and validated (no rows generated); ValueError with the
    class's own reason when it refuses the values."""
    from reasoning_gym.factory import DATASETS

    config_cls = DATASETS[name][1]
    hints = typing.get_type_hints(config_cls)
    kwargs = {k: _coerce(hints.get(k, Any), v) for k, v in config.items()}
    try:
        obj = config_cls(**kwargs, seed=seed, size=size)
        if hasattr(obj, "validate"):
            obj.validate()
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        reason = str(e) or type(e).__name__
        raise ValueError(f"{where}.config: {name} refuses it: {reason}") from None
    return obj


def check_values(cfg: TaskConfig) -> None:
    """Builds and validates each dataset's config class, generating no row: the values a
    dataset's config refuses (`max_digits` below `min_digits`, an unknown operator), as a
    ValueError naming the field. Needs the `reasoning` extra (MissingExtra without it)."""
    _require()
    for i, entry in enumerate(_entries(cfg)):
        _config_object(entry.name, entry.config, _where(cfg, i), seed=0, size=1)


def _dataset(cfg: TaskConfig, seed: int, size: int) -> Any:
    """The ProceduralDataset of `cfg` with this seed and size: the one dataset, or a
    CompositeDataset over `task.datasets` (which seeds its i-th dataset seed + i + 1)."""
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec
    from reasoning_gym.factory import DATASETS

    entries = _entries(cfg)
    # each config built and checked first, so that a refused value names its field
    objs = [
        _config_object(e.name, e.config, _where(cfg, i), seed=seed, size=size)
        for i, e in enumerate(entries)
    ]
    if not cfg.datasets:
        return DATASETS[entries[0].name][0](config=objs[0])
    specs = [DatasetSpec(e.name, e.weight, _coerced(e)) for e in entries]
    return CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=specs))


def _coerced(entry: WeightedDataset) -> dict[str, Any]:
    from reasoning_gym.factory import DATASETS

    hints = typing.get_type_hints(DATASETS[entry.name][1])
    return {k: _coerce(hints.get(k, Any), v) for k, v in entry.config.items()}


def row_key(row: Mapping[str, Any]) -> tuple[str, str]:
    """What makes two rows the same question: their dataset and their question text."""
    return (str(row.get("metadata", {}).get("source_dataset", "")), str(row["question"]))


def extract(completion: str) -> str:
    """The answer in a completion: its last `<answer>...</answer>`, else all of it, stripped."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(completion)
    return tagged if tagged is not None else completion.strip()


class ReasoningGymTask(Task):
    name = "reasoning_gym"

    def __init__(self, cfg: TaskConfig, run_seed: int = 0) -> None:
        """Generates every training and held-out row now (ValueError naming the field when the
        dataset's config refuses its values, or the question space is too small for the
        split); MissingExtra without the `reasoning` extra."""
        _require()
        seed = row_seed(cfg, run_seed)
        size = cfg.size if cfg.size is not None else DEFAULT_SIZE
        wanted = cfg.validation_size if cfg.validation_size is not None else DEFAULT_VALIDATION_SIZE
        self.system_prompt = cfg.system_prompt
        self.dataset = _dataset(cfg, seed, size)
        rows = [self.dataset[i] for i in range(size)]
        self.examples = [self._example(r) for r in rows]
        self.training_keys = {row_key(r) for r in rows}
        self.held = self._held_out(cfg, (seed + EVAL_SEED_OFFSET) % SEED_RANGE, wanted)
        self.seeds = (seed, (seed + EVAL_SEED_OFFSET) % SEED_RANGE)

    def _held_out(self, cfg: TaskConfig, seed: int, wanted: int) -> list[Example]:
        if not wanted:
            return []
        tries = wanted * HELD_OUT_TRIES
        other = _dataset(cfg, seed, tries)
        held: list[Example] = []
        seen = set(self.training_keys)
        for i in range(tries):
            row = other[i]
            key = row_key(row)
            if key in seen:
                continue
            seen.add(key)
            held.append(self._example(row))
            if len(held) == wanted:
                return held
        raise ValueError(
            f"task.validation_size={wanted}: only {len(held)} of {tries} rows generated with the "
            f"held-out seed are questions the {len(self.training_keys)} distinct training "
            "questions do not hold; lower task.size or task.validation_size, or widen the "
            "dataset's config"
        )

    def _example(self, row: dict[str, Any]) -> Example:
        question = str(row["question"])
        turns: list[dict[str, str]] = []
        if self.system_prompt:
            turns.append({"role": "system", "content": self.system_prompt})
        turns.append({"role": "user", "content": question})
        plain = f"{self.system_prompt}\n{question}" if self.system_prompt else question
        return Example(
            plain, str(row["answer"]), messages=tuple(turns), record=row, chat_optional=True
        )

    # -- Task ------------------------------------------------------------------------------

    def sample(self, rng: random.Random) -> Example:
        return self.examples[rng.randrange(len(self.examples))]

    def held_out(self) -> Sequence[Example]:
        return self.held

    def score(self, example: Example, completion: str) -> float:
        return self.grade([example], [completion]).rewards[0]

    def grade(self, examples: Sequence[Example], completions: Sequence[str]) -> Grades:
        """The dataset's `score_answer` of each completion's answer; one that raises or returns
        no number in [0, 1] scores 0 and counts in `grader_errors` (a fraction of the batch)."""
        rewards: list[float] = []
        errors = 0
        for example, completion in zip(examples, completions, strict=True):
            try:
                value = float(self.dataset.score_answer(extract(completion), dict(example.record)))
                if not math.isfinite(value) or not 0.0 <= value <= 1.0:
                    raise ValueError(f"score_answer returned {value}")
            except Exception:
                value, errors = 0.0, errors + 1
            rewards.append(value)
        n = max(1, len(rewards))
        return Grades(rewards, {"grader_errors": errors / n})


# -- the catalogue ---------------------------------------------------------------------------


def _kind(tp: Any) -> Kind:
    """What JSON a config field takes (`core.config.reasoning_gym_catalog.Kind`)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return "any"
        inner = _kind(rest[0])
        return f"{inner}?" if isinstance(inner, str) else [*inner, None]
    if origin is typing.Literal:
        return list(args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [m.value for m in tp]
    simple = {bool: "bool", int: "int", float: "float", str: "str", list: "list", tuple: "list"}
    if tp in simple:
        return simple[tp]
    if origin in (list, tuple, collections.abc.Sequence):
        return "list"
    return "any"


def catalog() -> dict[str, dict[str, Kind]]:
    """Every registered dataset but `composite` (`task.datasets` is it), with its config
    fields and what JSON each takes; `seed` and `size` left out (`task.seed`, `task.size`)."""
    _require()
    from reasoning_gym.factory import DATASETS

    out: dict[str, dict[str, Kind]] = {}
    for name, (_, config_cls) in sorted(DATASETS.items()):
        if name == "composite":
            continue
        hints = typing.get_type_hints(config_cls)
        out[name] = {
            f.name: _kind(hints[f.name])
            for f in dataclasses.fields(config_cls)
            if f.init and f.name not in ("seed", "size")
        }
    return out


def catalog_source() -> str:
    from importlib.metadata import version

    lines = [
        '"""Every reasoning-gym dataset and its config keys, with the JSON each takes: written by',
        "`python -m core.tasks.reasoning_gym` from reasoning-gym "
        f"{version('reasoning-gym')}; do not edit.",
        "",
        "Kinds: int, float, bool, str, list (a JSON array), any (the dataset's class decides); a",
        'trailing "?" also takes null; a list of values is the values taken.',
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "Kind = str | list[str | int | float | bool | None]",
        "",
        "CATALOG: dict[str, dict[str, Kind]] = {",
    ]
    for name, fields in catalog().items():
        lines.append(f"    {name!r}: {{")
        lines += [f"        {key!r}: {kind!r}," for key, kind in fields.items()]
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "config" / "reasoning_gym_catalog.py"
    target.write_text(catalog_source())
    print(f"{target}: {len(catalog())} datasets", file=sys.stderr)
