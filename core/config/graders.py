"""The graders a spec can declare under `train.task.grader`, as typed, strict pydantic models.

Pure schema (no grading code, no torch): the API validates a spec with it, the worker builds the
graders from it (`core.graders.build_grader`). A grader reads the completion and the record it
answers (every field of the JSONL line: the reference `answer`, test cases, a JSON schema), and
returns a score in [0, 1]. `multi` composes named sub-graders; `plugin` names a reward function an
operator installed under the `pdppo.graders` entry point group (a spec never carries code).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from core.config.openai_graders import OpenAIGrader
from core.config.types import FINITE, CleanStr

FieldName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z_][\w.-]*$")]
"""A record field a grader reads (`answer`, `tests`, `schema`, ...)."""

GraderName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][\w-]*$")]
"""A sub-grader's name in `multi`; it becomes the metric `grader/<name>`."""


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
]
