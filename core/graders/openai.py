"""OpenAI's graders (`core.config.openai_graders`), scoring as OpenAI describes them.

Templates (`core.graders.templates`) are rendered per completion: `{{item.<path>}}` from the
record (a string as it is, anything else as JSON), `{{sample.output_text}}` the completion,
`{{sample.output_json...}}` the completion parsed as JSON. A completion that is not the JSON a
template asks for is a wrong answer (0), not a grader failure; a record without a field a
template names fails the job at load time, like every grader's `check`.

The similarity metrics come from the libraries that define them (the `similarity` extra): a
missing one fails the job when its grader is built, naming the extra; they are imported when first
used, in the grading server. `python` and `score_model` (`core.graders.hosted`) are built only
where the operator's `GraderOptions` allow them; `refusal` says why not, at submission and on the
worker.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from core.config.openai_graders import (
    FORMULA_FUNCTIONS,
    OpenAIGraderConfig,
    OpenAILeafGrader,
    OpenAIMulti,
    OpenAIPython,
    OpenAIScoreModel,
    OpenAIStringCheck,
    OpenAITextSimilarity,
    parse_formula,
    template_paths,
)
from core.extras import require
from core.graders.base import Grader, Record, Scored
from core.graders.hosted import Python, ScoreModel
from core.graders.options import ENDPOINT_SETTING, PYTHON_SETTING, GraderOptions
from core.graders.templates import NotJson, check_paths, render


class _Templated(Grader):
    """A grader of two rendered templates."""

    def __init__(self, input_: str, reference: str) -> None:
        self.templates = (input_, reference)
        self.item_paths = [
            p for t in self.templates for p in template_paths(t) if p.startswith("item.")
        ]

    def check(self, record: Record) -> None:
        check_paths(self.item_paths, record)

    def pair(self, completion: str, record: Record) -> tuple[str, str] | None:
        """The rendered (input, reference), or None when the completion is not the JSON the
        templates read (a wrong answer)."""
        try:
            return (
                render(self.templates[0], completion, record),
                render(self.templates[1], completion, record),
            )
        except NotJson:
            return None


class StringCheck(_Templated):
    """eq, ne, like (contains), ilike (contains, ignoring case), on the rendered texts as they
    are: OpenAI's operations do not strip."""

    isolated = False  # linear in the text, our code only

    def __init__(self, cfg: OpenAIStringCheck) -> None:
        super().__init__(cfg.input, cfg.reference)
        self.operation = cfg.operation

    def score(self, completion: str, record: Record) -> float:
        pair = self.pair(completion, record)
        if pair is None:
            return 0.0
        got, want = pair
        if self.operation == "eq":
            return float(got == want)
        if self.operation == "ne":
            return float(got != want)
        if self.operation == "ilike":
            got, want = got.casefold(), want.casefold()
        return float(want in got)


_LIBRARIES = {"fuzzy_match": "rapidfuzz", "bleu": "sacrebleu", "gleu": "nltk"}
"""The library each metric comes from; the rouge metrics come from rouge_score."""


def similarity(metric: str) -> Callable[[str, str], float]:
    """(input, reference) -> [0, 1] for `metric`, from the library that defines it: rapidfuzz's
    ratio, sacrebleu's sentence BLEU, nltk's sentence GLEU on whitespace tokens, rouge-score's
    F-measure (the reference first, as its API wants)."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return lambda got, want: fuzz.ratio(got, want) / 100.0
    if metric == "bleu":
        import sacrebleu

        return lambda got, want: sacrebleu.sentence_bleu(got, [want]).score / 100.0
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return lambda got, want: float(sentence_gleu([want.split()], got.split()))
    from rouge_score import rouge_scorer

    kind = "rougeL" if metric == "rouge_l" else "rouge" + metric.removeprefix("rouge_")
    scorer = rouge_scorer.RougeScorer([kind])
    return lambda got, want: float(scorer.score(want, got)[kind].fmeasure)


class TextSimilarity(_Templated):
    """A similarity in [0, 1]; with `pass_threshold`, 1 at or above it and 0 below. Runs in the
    grading server: the libraries' time is not ours to bound."""

    def __init__(self, cfg: OpenAITextSimilarity, where: str) -> None:
        super().__init__(cfg.input, cfg.reference)
        self.metric = cfg.evaluation_metric
        library = _LIBRARIES.get(self.metric, "rouge_score")
        require(f"{where} (text_similarity {self.metric})", "similarity", (library,))
        self.threshold = cfg.pass_threshold
        self._measure: Callable[[str, str], float] | None = None

    def score(self, completion: str, record: Record) -> float:
        pair = self.pair(completion, record)
        if pair is None:
            return 0.0
        if self._measure is None:
            self._measure = similarity(self.metric)
        value = min(1.0, max(0.0, self._measure(*pair)))
        return value if self.threshold is None else float(value >= self.threshold)


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "floor": math.floor,
    "ceil": math.ceil,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
assert set(_FUNCTIONS) == set(FORMULA_FUNCTIONS)


def evaluate(tree: ast.Expression, scores: dict[str, float]) -> float:
    """The formula's value over the sub-graders' scores (the schema checked the tree: only
    numbers, names, + - * / ** and FORMULA_FUNCTIONS). A division by zero or a domain error
    raises: the grader failed, which the batch counts in `grader_errors`."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            return scores[node.id]
        if isinstance(node, ast.UnaryOp):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            return float(_BINARY[type(node.op)](walk(node.left), walk(node.right)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return float(_FUNCTIONS[node.func.id](*(walk(a) for a in node.args)))
        raise ValueError(f"calculate_output: {type(node).__name__} is not allowed")

    return walk(tree)


class Multi(Grader):
    """Sub-graders combined by `calculate_output`, clipped to [0, 1]; each sub-score is a part
    (the metric `grader/<name>`)."""

    def __init__(
        self, cfg: OpenAIMulti, where: str, options: GraderOptions, *, load: bool = False
    ) -> None:
        self.graders = {
            name: build_leaf(sub, f"{where}.graders.{name}", options, load=load)
            for name, sub in cfg.graders.items()
        }
        self.formula = parse_formula(cfg.calculate_output)
        self.isolated = any(g.isolated for g in self.graders.values())

    def check(self, record: Record) -> None:
        for grader in self.graders.values():
            grader.check(record)

    def grade(self, completion: str, record: Record) -> Scored:
        parts = {name: g.score(completion, record) for name, g in self.graders.items()}
        value = evaluate(self.formula, parts)
        if not math.isfinite(value):
            raise ValueError(f"calculate_output gave {value} for the scores {parts}")
        return Scored(min(1.0, max(0.0, value)), parts)

    def score(self, completion: str, record: Record) -> float:
        return self.grade(completion, record).value


def refusal(cfg: OpenAILeafGrader, where: str, options: GraderOptions | None = None) -> str | None:
    """Why this service cannot run the grader `cfg` (at `where`) with the operator's `options`,
    or None: a spec with one is refused at submission (`api.jobs.admission`), and again by a worker
    whose options differ from the API's."""
    options = options or GraderOptions()
    if isinstance(cfg, OpenAIPython) and not options.python:
        return (
            f"{where}: python graders are off on this service (they run a tenant's code on "
            f"the workers; the operator turns them on with {PYTHON_SETTING}=true); use "
            "string_check, text_similarity or multi"
        )
    if isinstance(cfg, OpenAIScoreModel) and options.score_model is None:
        return (
            f"{where}: score_model graders need a model endpoint, which this service has not "
            f"configured ({ENDPOINT_SETTING}); use string_check, text_similarity or multi"
        )
    return None


def refusals(
    cfg: OpenAIGraderConfig, where: str, options: GraderOptions | None = None
) -> list[tuple[str, str]]:
    """(where, why) for each grader in `cfg` this service cannot run."""
    leaves = cfg.graders.items() if isinstance(cfg, OpenAIMulti) else [("", cfg)]
    out = []
    for name, leaf in leaves:
        at = f"{where}.graders.{name}" if name else where
        problem = refusal(leaf, at, options)
        if problem is not None:
            out.append((at, problem))
    return out


def build_leaf(
    cfg: OpenAILeafGrader, where: str, options: GraderOptions, *, load: bool = False
) -> Grader:
    """`load`: run a python grader's code (the grading server only; elsewhere it is compiled
    and checked, never run)."""
    problem = refusal(cfg, where, options)
    if problem is not None:
        raise ValueError(problem)
    if isinstance(cfg, OpenAIStringCheck):
        return StringCheck(cfg)
    if isinstance(cfg, OpenAITextSimilarity):
        return TextSimilarity(cfg, where)
    if isinstance(cfg, OpenAIPython):
        return Python(cfg, where, load=load)
    if isinstance(cfg, OpenAIScoreModel) and options.score_model is not None:
        return ScoreModel(cfg, options.score_model)
    raise TypeError(f"{where}: unknown grader config {type(cfg).__name__}")


def build_openai(
    cfg: OpenAIGraderConfig,
    where: str,
    options: GraderOptions | None = None,
    *,
    load: bool = False,
) -> Grader:
    """The grader an OpenAI grader object declares; a ValueError naming `where` when this
    service cannot run it (`options`: what the operator allows; None allows neither python
    nor score_model)."""
    options = options or GraderOptions()
    if isinstance(cfg, OpenAIMulti):
        return Multi(cfg, where, options, load=load)
    return build_leaf(cfg, where, options, load=load)
