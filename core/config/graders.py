"""The graders a spec can declare under `train.task.grader`, as typed, strict pydantic models.

Pure schema (no grading code, no torch): the API validates a spec with it, the worker builds the
graders from it (`core.graders.build_grader`). A grader reads the completion and the record it
answers (every field of the JSONL line: the reference `answer`, test cases, a JSON schema), and
returns a score in [0, 1]. `multi` composes named sub-graders; `plugin` names a reward function an
operator installed under the `pdppo.graders` entry point group (a spec never carries code).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from core.config.openai_graders import OpenAIGrader
from core.config.types import FINITE, CleanStr

FieldName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z_][\w.-]*$")]
"""A record field a grader reads (`answer`, `tests`, `schema`, ...)."""

GraderName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][\w-]*$")]
"""A sub-grader's name in `multi`; it becomes the metric `grader/<name>`."""


MAX_SHOWN_CHARS = 80
"""Of a refused pattern, in its message (a pattern may hold 2000 characters)."""


def shown(pattern: str) -> str:
    """A pattern as a message shows it: its repr, cut after MAX_SHOWN_CHARS characters."""
    cut = pattern if len(pattern) <= MAX_SHOWN_CHARS else pattern[:MAX_SHOWN_CHARS] + "…"
    return repr(cut)


def compile_regex(pattern: str) -> re.Pattern[str]:
    """`pattern` compiled; a ValueError that shows it and says why not. Compiling is linear in
    the pattern (matching is what can backtrack without bound), so it is done at validation:
    a spec the API accepts never fails on the worker for its pattern."""
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise ValueError(f"{shown(pattern)} is not a regex ({e})") from None


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a JSON schema (checked against its draft's metaschema, formats such
    as a `pattern`'s regex included), or None. None too where jsonschema is not installed: a
    worker running the grader has it (its extra), and so do the API's installs (`server`)."""
    if not isinstance(schema, dict | bool):
        return f"a schema is an object (or true/false), not {type(schema).__name__}"
    if importlib.util.find_spec("jsonschema") is None:
        return None
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        return f"{e.message[:300]} (at '/{where}')"
    return None


class _Grader(BaseModel):
    # A field's alias is its name in a spec (`schema`, which as a field name would shadow
    # BaseModel.schema): dumps write the alias, so that every dump reads back (the API's stored
    # spec, the worker's config, a steered run: issue 49), and the field name is still read, so
    # that specs and checkpoints dumped before (`json_schema`) still load. Free-form fields (a
    # JSON schema, a plugin's options) are JsonValue, not Any: a YAML date, NaN or an integer
    # key would pass as Any and come back from the stored JSON as another value.
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        serialize_by_alias=True,
        validate_by_alias=True,
        validate_by_name=True,
    )


class StringCheckGrader(_Grader):
    """1 when the stripped completion equals (or contains) the reference, else 0."""

    type: Literal["string_check"]
    operation: Literal["equals", "contains"] = Field(
        default="equals", description="equals: whole completion; contains: anywhere in it."
    )
    case_sensitive: bool = Field(default=True, description="False compares case-folded text.")
    field: FieldName = Field(default="answer", description="Record field holding the reference.")


class RegexGrader(_Grader):
    """1 when the pattern matches the stripped completion, else 0."""

    type: Literal["regex"]
    pattern: Annotated[str, Field(max_length=2000)] | None = Field(
        default=None, description="A fixed pattern; unset: the record's `field` holds it."
    )
    field: FieldName = Field(default="answer", description="Record field holding the pattern.")
    mode: Literal["fullmatch", "search"] = Field(
        default="fullmatch", description="fullmatch: the whole completion; search: any part."
    )
    case_sensitive: bool = Field(default=True, description="False adds re.IGNORECASE.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            compile_regex(pattern)  # flags change what matches, never whether it compiles
        return pattern


class NumericGrader(_Grader):
    """1 when the number in the completion is within tolerance of the reference number."""

    type: Literal["numeric"]
    field: FieldName = Field(default="answer", description="Record field holding the number.")
    extract: Annotated[str, Field(max_length=2000)] | None = Field(
        default=None,
        description=(
            "Regex with one group that captures the answer in the completion; unset: the last "
            "number in the completion."
        ),
    )
    tolerance: Annotated[float, Field(ge=0, le=1e12), FINITE] = Field(
        default=1e-6, description="Absolute tolerance."
    )
    relative_tolerance: Annotated[float, Field(ge=0, le=1), FINITE] = Field(
        default=0.0, description="Also accept |got - want| <= this * |want|."
    )

    @field_validator("extract")
    @classmethod
    def _one_group(cls, extract: str | None) -> str | None:
        if extract is not None:
            groups = compile_regex(extract).groups
            if groups != 1:
                raise ValueError(
                    f"{shown(extract)} must have exactly one group (the answer), not {groups}"
                )
        return extract


class MathGrader(_Grader):
    """1 when the completion's final answer is symbolically equal to the reference
    (`1/2`, `0.5` and `\\frac{1}{2}` are all the same answer), checked with math-verify."""

    type: Literal["math"]
    field: FieldName = Field(default="answer", description="Record field holding the answer.")


class JsonSchemaGrader(_Grader):
    """1 when the completion parses as JSON and validates against the schema, else 0."""

    type: Literal["json_schema"]
    json_schema: dict[str, JsonValue] | None = Field(
        default=None,
        alias="schema",
        description="A fixed JSON schema; unset: the record's `field` holds it.",
    )
    field: FieldName = Field(default="schema", description="Record field holding the schema.")

    @field_validator("json_schema")
    @classmethod
    def _is_a_schema(cls, schema: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        problem = None if schema is None else schema_problem(schema)
        if problem:
            raise ValueError(f"not a valid JSON schema: {problem}")
        return schema

    @model_validator(mode="before")
    @classmethod
    def _one_name(cls, data: Any) -> Any:
        """`json_schema`, the field's name, is read for specs dumped before it was written as
        `schema`; both at once would leave one of them silently unused."""
        if isinstance(data, dict) and "schema" in data and "json_schema" in data:
            raise ValueError("give the schema as `schema` only (json_schema is its old name)")
        return data


class LengthPenaltyGrader(_Grader):
    """1 for completions of at most `max_chars` characters, falling linearly to 0 at
    `2 * max_chars`: composed in `multi`, it keeps answers short."""

    type: Literal["length_penalty"]
    max_chars: int = Field(ge=1, le=1_000_000, description="Longest completion with full score.")


class PluginGrader(_Grader):
    """A reward function an operator installed under the `pdppo.graders` entry point group:
    `fn(completion: str, record: dict, **options) -> float`, its result clipped to [0, 1]."""

    type: Literal["plugin"]
    name: Annotated[CleanStr, Field(min_length=1, max_length=200)] = Field(
        description="Entry point name in the `pdppo.graders` group."
    )
    options: dict[str, JsonValue] = Field(
        default_factory=dict, description="Keyword arguments passed to the function."
    )


LeafGraderConfig = Annotated[
    StringCheckGrader
    | RegexGrader
    | NumericGrader
    | MathGrader
    | JsonSchemaGrader
    | LengthPenaltyGrader
    | PluginGrader,
    Field(discriminator="type"),
]
"""Every grader but `multi`: what a `multi` combines."""


class MultiGrader(_Grader):
    """Weighted mean of named sub-graders, sum(w * s) / sum(w); each sub-score is reported as
    the metric `grader/<name>`. Sub-graders are not `multi` themselves: one level says all a
    weighted sum can, and the spec's JSON schema stays free of recursion (which schema-driven
    clients and fuzzers handle badly)."""

    type: Literal["multi"]
    graders: dict[GraderName, LeafGraderConfig] = Field(
        min_length=1, max_length=32, description="Sub-graders by name."
    )
    weights: dict[GraderName, Annotated[float, Field(ge=0, le=1e6), FINITE]] = Field(
        default_factory=dict, description="Weight per sub-grader name (default 1)."
    )

    @model_validator(mode="after")
    def _check(self) -> MultiGrader:
        unknown = sorted(set(self.weights) - set(self.graders))
        if unknown:
            raise ValueError(f"weights name no sub-grader: {unknown}")
        if sum(self.weights.get(name, 1.0) for name in self.graders) <= 0:
            raise ValueError("the weights of the sub-graders sum to 0")
        return self


GraderConfig = Annotated[
    StringCheckGrader
    | RegexGrader
    | NumericGrader
    | MathGrader
    | JsonSchemaGrader
    | LengthPenaltyGrader
    | PluginGrader
    | MultiGrader
    | OpenAIGrader,
    Field(discriminator="type"),
]


__all__ = [
    "GraderConfig",
    "JsonSchemaGrader",
    "LeafGraderConfig",
    "LengthPenaltyGrader",
    "MathGrader",
    "MultiGrader",
    "NumericGrader",
    "OpenAIGrader",
    "PluginGrader",
    "RegexGrader",
    "StringCheckGrader",
    "compile_regex",
    "schema_problem",
]
