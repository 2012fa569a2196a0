"""Unknown names told with the close ones: "unknown field lrr; did you mean lr?".

One rule for every place a name is looked up: a spec's keys (the API's 422, `pdppo train`,
`pdppo submit`), and the settings a running job may change (`core.training.steering`). A key of
a spec is found by walking pydantic's error location through the models (sections, the grader
kinds a union picks by its tag, mappings and lists), so a section added later needs nothing here.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Tag

MAX_LISTED = 40
"""Names listed when none is close (a section has at most this many fields)."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ "; did you mean X?" for the name of `known` closest to `name`, or "" when none is."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def field_names(model: type[BaseModel]) -> list[str]:
    """The keys a model takes, as a spec writes them (by alias)."""
    return [info.alias or name for name, info in model.model_fields.items()]


def _strip(tp: Any) -> tuple[Any, str | None]:
    """`tp` without its Annotated layers, and the union Tag they held."""
    tag = None
    while get_origin(tp) is Annotated:
        tp, *meta = get_args(tp)
        tag = next((m.tag for m in meta if isinstance(m, Tag)), tag)
    return tp, tag


def _kind(model: Any) -> Any:
    """The value of a model's `type` literal (the tag of a discriminated union), if it has one."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    info = model.model_fields.get("type")
    if info is None or get_origin(info.annotation) is not Literal:
        return None
    values = get_args(info.annotation)
    return values[0] if len(values) == 1 else None


def _step(tp: Any, part: str | int) -> Any:
    """The type under `tp` at one part of an error location, or None when it does not fit."""
    tp, _ = _strip(tp)
    if get_origin(tp) in (Union, types.UnionType):
        members = [_strip(m) for m in get_args(tp) if m is not type(None)]
        if len(members) == 1:
            return _step(members[0][0], part)
        for member, tag in members:
            name = getattr(member, "__name__", None)
            if part in (tag, _kind(member), name):
                return member
        return None
    if get_origin(tp) is dict:
        return get_args(tp)[1]
    if get_origin(tp) is list:
        return get_args(tp)[0] if isinstance(part, int) else None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        for name, info in tp.model_fields.items():
            if part in (name, info.alias):
                return info.annotation
    return None


def model_at(root: Any, loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model that validated the mapping at `loc` under `root` (a model or a type), or None
    where the location leaves the models."""
    tp: Any = root
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return None
    tp, _ = _strip(tp)
    if get_origin(tp) in (Union, types.UnionType):  # an optional section: `LoraConfig | None`
        models = [m for m, _ in map(_strip, get_args(tp)) if m is not type(None)]
        tp = models[0] if len(models) == 1 else None
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def unknown_field(root: Any, loc: Sequence[str | int]) -> str:
    """The message for an unknown key at `loc` (its last part) under `root`: the close field
    of that section, else the fields it takes."""
    name = str(loc[-1]) if loc else ""
    model = model_at(root, loc[:-1])
    if model is None:
        return "unknown field"
    known = field_names(model)
    guess = did_you_mean(name, known)
    if guess:
        return f"unknown field {name}{guess}"
    listed = ", ".join(known[:MAX_LISTED])
    return f"unknown field {name} (this section takes: {listed})"


def explained(errors: Iterable[Mapping[str, Any]], root: Any) -> list[dict[str, Any]]:
    """pydantic's errors (`exc.errors()`) with each unknown key's message naming the close
    field (`unknown_field`); every other error as it is."""
    return [
        {**e, "msg": unknown_field(root, e["loc"])}
        if e.get("type") == "extra_forbidden"
        else dict(e)
        for e in errors
    ]


__all__ = ["did_you_mean", "explained", "field_names", "model_at", "unknown_field"]
