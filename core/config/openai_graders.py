"""OpenAI's grader objects, as a spec declares them under `task.grader: {type: openai, grader:
{...}}`, and as `POST /v1/fine_tuning/jobs` receives them in `method.reinforcement.grader`.

Users who come from OpenAI's reinforcement fine-tuning have graders written in that shape:
templates (`{{sample.output_text}}`, `{{item.answer}}`) instead of field names, `string_check`
with `eq`/`ne`/`like`/`ilike`, `text_similarity`, and `multi` with a `calculate_output`
formula instead of weights. Accepting them as they are, rather than translating each into
pdppo's own graders, keeps their scores what OpenAI would give: `ne` and formulas such as
`min(a, b)` have no weighted-mean equivalent.

Pure schema, like `core.config.graders`: what a template may name and what a formula may call
is checked here, so a mistake is a 422 at submission, not a job that scores 0 for hours.
"""

from __future__ import annotations

import ast
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

TEMPLATE_RE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
"""`{{ namespace.path }}`: what a template substitutes."""

TEMPLATE_PATH_RE = re.compile(r"^(item|sample)((?:\.[A-Za-z_][\w-]*)+)$")
"""What a template may name: a record field (`item.answer`, `item.meta.level`) or the sample
(`sample.output_text`, `sample.output_json.key`)."""

SAMPLE_PATHS = ("output_text", "output_json")
"""What `sample.` offers: the completion as text, or parsed as JSON."""

FORMULA_FUNCTIONS = ("min", "max", "abs", "floor", "ceil", "exp", "sqrt", "log")
"""What `calculate_output` may call, besides + - * / ^ and parentheses (OpenAI's list)."""

SubGraderName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_]\w*$")]
"""A sub-grader's name in `multi`: an identifier, since `calculate_output` names it."""


class _OpenAIGrader(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    name: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        description="The grader's name (OpenAI requires one; pdppo shows it in metrics)."
    )


def template_paths(template: str) -> list[str]:
    """The paths a template substitutes, in order; a ValueError naming the first that is not
    `item.<field>` or `sample.output_text`/`sample.output_json[.<key>]`."""
    paths = TEMPLATE_RE.findall(template)
    for path in paths:
        found = TEMPLATE_PATH_RE.match(path)
        if found is None:
            raise ValueError(
                f"template {{{{{path}}}}} names neither item.<field> nor sample.output_text"
            )
        if found.group(1) == "sample":
            first = found.group(2).split(".")[1]
            if first not in SAMPLE_PATHS or (
                first == "output_text" and path != "sample.output_text"
            ):
                raise ValueError(
                    f"template {{{{{path}}}}}: a sample offers output_text and output_json[.<key>]"
                )
    return paths


def _template(value: str) -> str:
    template_paths(value)
    return value


Template = Annotated[str, Field(max_length=10_000), AfterValidator(_template)]
"""Text with `{{...}}` substitutions, each checked (`template_paths`) where the spec says it."""


class OpenAIStringCheck(_OpenAIGrader):
    """1 when the rendered `input` and `reference` pass `operation`, else 0: `eq` equal, `ne`
    different, `like` the input contains the reference, `ilike` the same ignoring case."""

    type: Literal["string_check"]
    input: Template = Field(description="What is checked, usually {{sample.output_text}}.")
    reference: Template = Field(description="What it is checked against, e.g. {{item.answer}}.")
    operation: Literal["eq", "ne", "like", "ilike"]


class OpenAITextSimilarity(_OpenAIGrader):
    """The similarity of the rendered `input` to `reference`, in [0, 1], by a metric a
    well-kept library computes: fuzzy_match (rapidfuzz), bleu (sacrebleu), gleu (nltk),
    rouge_1..5 and rouge_l (rouge-score). meteor (needs WordNet data) and cosine (needs an embedding
    model) are refused rather than approximated."""

    type: Literal["text_similarity"]
    input: Template
    reference: Template
    evaluation_metric: Literal[
        "fuzzy_match",
        "bleu",
        "gleu",
        "meteor",
        "cosine",
        "rouge_1",
        "rouge_2",
        "rouge_3",
        "rouge_4",
        "rouge_5",
        "rouge_l",
    ]
    pass_threshold: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description="When set, the score is 1 at or above it and 0 below."
    )

    @field_validator("evaluation_metric")
    @classmethod
    def _supported(cls, metric: str) -> str:
        if metric == "meteor":
            raise ValueError("meteor needs WordNet data, which pdppo does not download: use bleu")
        if metric == "cosine":
            raise ValueError("cosine needs an embedding model, which pdppo does not run")
        return metric


def parse_source(source: str) -> ast.Module:
    """A python grader's code, parsed (never run); a ValueError when it is not python or
    defines no top-level `grade` function. Parsing at validation refuses what the worker could
    not load, and keeps the parser's own failures on code nested past its limits (MemoryError,
    RecursionError) out of the API, as a 422 rather than a 500."""
    try:
        tree = ast.parse(source, "<source>")
    except SyntaxError as e:
        raise ValueError(f"not python: {e.msg} (line {e.lineno})") from None
    except (MemoryError, RecursionError):
        raise ValueError("not python: nested too deeply to parse") from None
    except ValueError as e:  # a NUL byte (Python 3.11)
        raise ValueError(f"not python: {e}") from None
    if not any(isinstance(n, ast.FunctionDef) and n.name == "grade" for n in tree.body):
        raise ValueError("defines no function grade(sample, item)")
    return tree


class OpenAIPython(_OpenAIGrader):
    """`def grade(sample, item) -> float` in `source`, run in the grading server's process
    under its deadline (`sample`: `output_text`, `output_json`, `output_tools`; `item`: the
    record). Refused unless the operator allows it (PDPPO_OPENAI_PYTHON_GRADERS), because it is a
    tenant's code on the worker."""

    type: Literal["python"]
    source: Annotated[str, Field(min_length=1, max_length=100_000)]
    image_tag: Annotated[str, Field(max_length=200)] | None = Field(
        default=None, description="Accepted for compatibility; pdppo runs its own image."
    )
    pass_threshold: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description="When set, the score is 1 at or above it and 0 below."
    )

    @field_validator("source")
    @classmethod
    def _parses(cls, source: str) -> str:
        parse_source(source)
        return source


class OpenAITextPart(BaseModel):
    """One text part of a message's content."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["input_text", "output_text"]
    text: Template


def _content_kind(value: Any) -> str:
    if isinstance(value, str):
        return "text"
    return "parts" if isinstance(value, list) else "part"


class OpenAIMessage(BaseModel):
    """A message of a `score_model` grader's input: text only (images and audio are refused,
    pdppo's endpoints are text models)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    # chosen by the value's JSON type, so that a mistake is told for the branch the user wrote
    # (`content.parts.0.text: template ...`), not for all three
    content: Annotated[
        Annotated[Template, Tag("text")]
        | Annotated[OpenAITextPart, Tag("part")]
        | Annotated[list[OpenAITextPart], Tag("parts")],
        Discriminator(_content_kind),
    ]

    def text(self) -> str:
        """The content as one text (parts joined by blank lines)."""
        if isinstance(self.content, str):
            return self.content
        parts = self.content if isinstance(self.content, list) else [self.content]
        return "\n\n".join(p.text for p in parts)


SCORE_BOUND = 1e9
"""The largest score a range or threshold names: every number a spec holds is bounded."""


class OpenAISamplingParams(BaseModel):
    """What OpenAI's `score_model` passes to the model; sent to the endpoint as they are
    (`max_completions_tokens` as `max_tokens`)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    # an int64, as the endpoints take it
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    max_completions_tokens: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None


class OpenAIScoreModel(_OpenAIGrader):
    """A model that reads the rendered `input` messages and answers a score in `range`: the
    grader calls the operator's OpenAI-compatible endpoint (PDPPO_SCORE_MODEL_ENDPOINT), reads
    the number in the reply and maps `range` onto [0, 1]. Refused where no endpoint is set."""

    type: Literal["score_model"]
    model: Annotated[str, Field(min_length=1, max_length=200)]
    input: list[OpenAIMessage] = Field(min_length=1, max_length=64)
    range: list[Annotated[float, Field(ge=-SCORE_BOUND, le=SCORE_BOUND)]] = Field(
        default_factory=lambda: [0.0, 1.0],
        min_length=2,
        max_length=2,
        description="The scores the model answers, [low, high]; low maps to 0, high to 1.",
    )
    sampling_params: OpenAISamplingParams | None = None
    pass_threshold: Annotated[float, Field(ge=-SCORE_BOUND, le=SCORE_BOUND)] | None = Field(
        default=None, description="When set (in `range`'s units), 1 at or above it, 0 below."
    )

    @field_validator("range")
    @classmethod
    def _ordered(cls, value: list[float]) -> list[float]:
        if not value[0] < value[1]:
            raise ValueError(f"range [{value[0]:g}, {value[1]:g}] must be [low, high], low < high")
        return value


OpenAILeafGrader = Annotated[
    OpenAIStringCheck | OpenAITextSimilarity | OpenAIPython | OpenAIScoreModel,
    Field(discriminator="type"),
]


class OpenAIMulti(_OpenAIGrader):
    """Named sub-graders combined by `calculate_output`, a formula over their names (e.g.
    `0.5 * exact + 0.5 * close`, `min(exact, format)`), its result clipped to [0, 1]."""

    type: Literal["multi"]
    graders: dict[SubGraderName, OpenAILeafGrader] = Field(min_length=1, max_length=32)
    calculate_output: Annotated[str, Field(min_length=1, max_length=2000)]

    @model_validator(mode="after")
    def _formula(self) -> OpenAIMulti:
        formula_names(self.calculate_output, set(self.graders))
        return self


OpenAIGraderConfig = Annotated[
    OpenAIStringCheck | OpenAITextSimilarity | OpenAIPython | OpenAIScoreModel | OpenAIMulti,
    Field(discriminator="type"),
]


_ALLOWED = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Load,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.Pow,
    ast.USub,
    ast.UAdd,
)
"""The formula's other nodes: arithmetic, nothing that reads or calls anything."""


def parse_formula(formula: str) -> ast.Expression:
    """`formula` as an expression tree (`^` read as a power, as OpenAI writes it); a
    ValueError when it does not parse."""
    try:
        return ast.parse(formula.replace("^", "**"), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"calculate_output {formula!r} is not a formula ({e.msg})") from None


def formula_names(formula: str, graders: set[str]) -> set[str]:
    """The grader names `formula` reads; a ValueError for anything but numbers, those names,
    + - * / ^, parentheses and calls to FORMULA_FUNCTIONS."""
    names: set[str] = set()
    tree = parse_formula(formula)
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FORMULA_FUNCTIONS:
                raise ValueError(f"calculate_output may call {', '.join(FORMULA_FUNCTIONS)} only")
            if node.keywords or not node.args:
                raise ValueError(f"calculate_output: {node.func.id}() takes numbers only")
        elif isinstance(node, ast.Name):
            if id(node) in callees:
                continue  # checked with its Call
            if node.id not in graders:
                raise ValueError(
                    f"calculate_output names {node.id!r}, which is no grader of this multi "
                    f"({', '.join(sorted(graders))})"
                )
            names.add(node.id)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise ValueError("calculate_output: only numbers may appear as constants")
        elif not isinstance(node, _ALLOWED):
            raise ValueError(
                f"calculate_output: {type(node).__name__} is not allowed; use numbers, grader "
                "names, + - * / ^ and " + ", ".join(FORMULA_FUNCTIONS)
            )
    return names


class OpenAIGrader(BaseModel):
    """An OpenAI grader object inside a pdppo spec: `{type: openai, grader: {...}}`."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    type: Literal["openai"]
    grader: OpenAIGraderConfig


__all__ = [
    "FORMULA_FUNCTIONS",
    "OpenAIGrader",
    "OpenAIGraderConfig",
    "OpenAILeafGrader",
    "OpenAIMessage",
    "OpenAIMulti",
    "OpenAIPython",
    "OpenAISamplingParams",
    "OpenAIScoreModel",
    "OpenAIStringCheck",
    "OpenAITextSimilarity",
    "formula_names",
    "parse_formula",
    "parse_source",
    "template_paths",
]
