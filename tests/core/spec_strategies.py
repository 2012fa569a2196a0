"""Hypothesis strategies for job specs, drawn from the pydantic models themselves.

Every field of every section is read from the model (its annotation, bounds, length limits and
pattern), so a field added to the spec is drawn without a change here. What a random draw cannot
hit (a python grader's code, a `calculate_output` naming its sub-graders, weights naming them)
has a strategy of its own in OVERRIDES. Draws are raw JSON data, as a user writes them; a draw
that breaks a cross-field rule is left for the test to filter (`valid`).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from hypothesis import strategies as st
from pydantic import BaseModel, JsonValue, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from core.config.environment import EnvironmentConfig
from core.config.graders import MultiGrader
from core.config.openai_graders import FORMULA_FUNCTIONS, OpenAIMulti, OpenAIPython
from core.config.reasoning_gym import dataset_names
from core.config.task import REASONING_GYM_FIELDS, TaskConfig

Strategy = st.SearchStrategy[Any]

SMALL_INT = 8
"""Ints are drawn near their lower bound as often as anywhere in their range: cross-field rules
(minibatches dividing the batch) hold for small values, and a draw the rules refuse is wasted."""

NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True)
"""A sub-grader name: an identifier, which every grader kind's name pattern accepts."""

TEXT = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=12)
"""Printable text (names and paths refuse control characters, JSON refuses lone surrogates)."""

JSON_VALUES: Strategy = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
"""Any JSON value: what a free-form field (a JSON schema, a plugin's options) holds."""

PYTHON_SOURCES = st.sampled_from(
    [
        "def grade(sample, item):\n    return 1.0\n",
        "import math\n\ndef grade(sample, item):\n    return math.sqrt(0.25)\n",
    ]
)


def _bounds(meta: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in meta:
        if isinstance(m, at.Ge):
            out["min"] = m.ge
        elif isinstance(m, at.Gt):
            out["min"], out["exclude_min"] = m.gt, True
        elif isinstance(m, at.Le):
            out["max"] = m.le
        elif isinstance(m, at.Lt):
            out["max"], out["exclude_max"] = m.lt, True
        elif isinstance(m, at.MinLen):
            out["min_len"] = m.min_length
        elif isinstance(m, at.MaxLen):
            out["max_len"] = m.max_length
        elif getattr(m, "pattern", None) is not None:
            out["pattern"] = m.pattern
    return out


def _flat(meta: list[Any]) -> list[Any]:
    """Metadata with the FieldInfos of nested `Annotated[..., Field(...)]` opened up."""
    out: list[Any] = []
    for m in meta:
        out += m.metadata if isinstance(m, FieldInfo) else [m]
    return out


def _int(b: dict[str, Any]) -> Strategy:
    lo = b.get("min", -(2**31)) + (1 if b.get("exclude_min") else 0)
    hi = b.get("max", 2**31) - (1 if b.get("exclude_max") else 0)
    return st.integers(lo, min(hi, lo + SMALL_INT)) | st.integers(lo, hi)


def _float(b: dict[str, Any]) -> Strategy:
    lo, hi = b.get("min", -1e12), b.get("max", 1e12)
    drawn = st.floats(
        lo,
        hi,
        exclude_min=b.get("exclude_min", False),
        exclude_max=b.get("exclude_max", False),
        allow_nan=False,
        allow_infinity=False,
    )
    # an int where a float goes is valid JSON for it (and dumped back as a float)
    ints = st.integers(math.ceil(lo), math.floor(min(hi, lo + SMALL_INT))).filter(
        lambda v: (v > lo or not b.get("exclude_min")) and (v < hi or not b.get("exclude_max"))
    )
    return drawn | ints


def _str(b: dict[str, Any]) -> Strategy:
    lo = b.get("min_len", 0)
    if "pattern" in b:
        hi = b.get("max_len", math.inf)
        return st.from_regex(b["pattern"], fullmatch=True).filter(lambda s: lo <= len(s) <= hi)
    hi = min(b.get("max_len", 24), 24)
    return st.text(st.characters(exclude_categories=("Cc", "Cs")), min_size=lo, max_size=hi)


def for_type(tp: Any, meta: list[Any] | None = None) -> Strategy:
    """Raw JSON data for a value of type `tp` with the constraints `meta`."""
    meta = _flat(meta or [])
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *extra = get_args(tp)
        return for_type(inner, [*_flat(extra), *meta])
    if origin in (Union, types.UnionType):
        return st.one_of(*(for_type(arg, meta) for arg in get_args(tp)))
    if origin is Literal:
        return st.sampled_from(get_args(tp))
    b = _bounds(meta)
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return _int(b)
    if tp is float:
        return _float(b)
    if tp is str:
        return _str(b)
    if tp is Any or tp is JsonValue:
        return JSON_VALUES
    if origin is dict:
        key, value = get_args(tp)
        lo, hi = b.get("min_len", 0), min(b.get("max_len", 3), 3)
        return st.dictionaries(for_type(key), for_type(value), min_size=lo, max_size=hi)
    if origin is list:
        (item,) = get_args(tp)
        lo, hi = b.get("min_len", 0), min(b.get("max_len", 3), 3)
        return st.lists(for_type(item), min_size=lo, max_size=hi)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return for_model(tp)
    raise TypeError(f"no strategy for {tp!r}")


def for_model(model: type[BaseModel]) -> Strategy:
    """A model's raw data: its required fields always, each optional one or not (by alias, as
    a spec names it), or what OVERRIDES draws for it."""
    if model in OVERRIDES:
        return OVERRIDES[model]()
    return _fields(model)


def _fields(model: type[BaseModel]) -> Strategy:
    required: dict[str, Strategy] = {}
    optional: dict[str, Strategy] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        drawn = st.deferred(lambda info=info: for_type(info.annotation, list(info.metadata)))
        (required if info.is_required() else optional)[key] = drawn
    return st.fixed_dictionaries(required, optional=optional)


@st.composite
def _openai_multi(draw: st.DrawFn) -> dict[str, Any]:
    """A formula over the sub-graders' own names, with every function it may call."""
    names = draw(st.lists(NAME, min_size=1, max_size=3, unique=True))
    leaf = get_args(OpenAIMulti.model_fields["graders"].annotation)[1]
    graders = {n: draw(for_type(leaf)) for n in names}
    fn = draw(st.sampled_from(FORMULA_FUNCTIONS))
    formula = f"{fn}({' + '.join(names)}) * 0.5 ^ 1 - -1"
    return {"type": "multi", "name": draw(NAME), "graders": graders, "calculate_output": formula}


@st.composite
def _openai_python(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = draw(_fields(OpenAIPython))
    return data | {"source": draw(PYTHON_SOURCES)}


@st.composite
def _multi(draw: st.DrawFn) -> dict[str, Any]:
    """Weights for some of the drawn sub-graders (a weight naming none is refused)."""
    data: dict[str, Any] = draw(_fields(MultiGrader))
    names = sorted(data["graders"])
    weights = draw(st.dictionaries(st.sampled_from(names), _float({"min": 0.5, "max": 1e6})))
    return data | {"weights": weights}


JSONL_ONLY = ("path", "file", "validation_path", "validation_file", "validation_fraction", "grader")
"""Task fields a built-in task refuses."""


@st.composite
def task(draw: st.DrawFn, name: str | None = None) -> dict[str, Any]:
    """A task section of kind `name` (None: any) whose data sources fit it: none for a built-in
    task, one of `path` and `file` for jsonl, a held-out file or a held-out fraction (drawing
    them freely, 1 in 64 draws of a built-in task would be valid)."""
    data: dict[str, Any] = draw(_fields(TaskConfig))
    data["name"] = name or data.get("name", TaskConfig.model_fields["name"].default)
    if data["name"] == "environment":
        return _environment(draw, data)
    data.pop("environment", None)
    if data["name"] == "reasoning_gym":
        return _reasoning_gym(draw, {k: v for k, v in data.items() if k not in JSONL_ONLY})
    data = {k: v for k, v in data.items() if k not in (*REASONING_GYM_FIELDS, "system_prompt")}
    if data["name"] != "jsonl":
        return {k: v for k, v in data.items() if k not in JSONL_ONLY}
    if ("path" in data) == ("file" in data):
        keep = draw(st.sampled_from(["path", "file"]))
        data.pop("file" if keep == "path" else "path", None)
        if keep not in data:
            field = TaskConfig.model_fields[keep]
            data[keep] = draw(for_type(field.annotation, list(field.metadata)).filter(bool))
    if "validation_path" in data:
        data.pop("validation_file", None)
    if "validation_path" in data or "validation_file" in data:
        data.pop("validation_fraction", None)
    return data


def _environment(draw: st.DrawFn, data: dict[str, Any]) -> dict[str, Any]:
    """A `task.environment` section (drawn freely when the draw has none), and none of the
    fields another task takes, nor a warm-up."""
    if "environment" not in data:
        data["environment"] = draw(_fields(EnvironmentConfig))
    only = (*JSONL_ONLY, *REASONING_GYM_FIELDS, "system_prompt", "warmup_steps")
    return {k: v for k, v in data.items() if k not in only}


def _reasoning_gym(draw: st.DrawFn, data: dict[str, Any]) -> dict[str, Any]:
    """Exactly one of `dataset` (with its config) and `datasets`, named from the shipped
    catalogue with an empty config (a config drawn freely names keys no dataset has)."""
    names = dataset_names()
    data.pop("config", None)
    if draw(st.booleans()):
        data.pop("datasets", None)
        data["dataset"] = draw(st.sampled_from(names))
        if draw(st.booleans()):
            data["config"] = {}
        return data
    data.pop("dataset", None)
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    weights = st.floats(min_value=0.01, max_value=100, allow_nan=False)
    data["datasets"] = [{"name": n, "weight": draw(weights), "config": {}} for n in chosen]
    return data


OVERRIDES: dict[type[BaseModel], Callable[[], Strategy]] = {
    TaskConfig: task,
    MultiGrader: _multi,
    OpenAIMulti: _openai_multi,
    OpenAIPython: _openai_python,
}


def valid(adapter: TypeAdapter[Any], data: Any) -> Any | None:
    """The model `data` validates to, or None when a rule refuses it (the draw is skipped)."""
    try:
        return adapter.validate_python(data)
    except ValidationError:
        return None
