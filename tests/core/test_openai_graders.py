"""OpenAI's grader objects in a spec (`task.grader: {type: openai, grader: {...}}`): what the
schema refuses, how templates render, and the scores each grader gives, against values worked
out by hand (or, for the similarity metrics, by the defining library called directly)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from core.config.graders import GraderConfig
from core.graders import build_grader
from core.graders.base import Grader
from core.graders.openai import render

ADAPTER: TypeAdapter[Any] = TypeAdapter(GraderConfig)
OUT, ANSWER = "{{sample.output_text}}", "{{item.answer}}"


def openai(grader: dict[str, Any]) -> Grader:
    return build_grader(ADAPTER.validate_python({"type": "openai", "grader": grader}))


def check(operation: str, input_: str = OUT, reference: str = ANSWER) -> Grader:
    return openai(
        {
            "type": "string_check",
            "name": "c",
            "input": input_,
            "reference": reference,
            "operation": operation,
        }
    )


def refusal(grader: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        ADAPTER.validate_python({"type": "openai", "grader": grader})
    return str(caught.value.errors()[0]["msg"])


@pytest.mark.parametrize(
    ("operation", "completion", "answer", "score"),
    [
        ("eq", "42", "42", 1.0),
        ("eq", " 42", "42", 0.0),  # OpenAI's eq compares the texts as they are
        ("eq", "Paris", "paris", 0.0),
        ("ne", "41", "42", 1.0),
        ("ne", "42", "42", 0.0),
        ("like", "it is 42.", "42", 1.0),
        ("like", "it is 4 2", "42", 0.0),
        ("like", "PARIS, France", "Paris", 0.0),
        ("ilike", "PARIS, France", "Paris", 1.0),
        ("ilike", "Lyon", "Paris", 0.0),
    ],
)
def test_string_check_operations(
    operation: str, completion: str, answer: str, score: float
) -> None:
    assert check(operation).score(completion, {"answer": answer}) == score


def test_templates_render_item_paths_and_the_sample() -> None:
    record = {"answer": "42", "meta": {"level": 3, "tags": ["a", "b"]}, "n": 7}
    assert render("{{ item.answer }}/{{item.meta.level}}/{{item.n}}", "out", record) == "42/3/7"
    assert render("{{item.meta.tags}} {{item.meta}}", "", record) == (
        '["a", "b"] {"level": 3, "tags": ["a", "b"]}'
    )
    assert render("[{{sample.output_text}}]", "hi there", record) == "[hi there]"
    completion = '{"city": "Paris", "pop": {"m": 2.1}}'
    assert render("{{sample.output_json.city}} {{sample.output_json.pop.m}}", completion, {}) == (
        "Paris 2.1"
    )


def test_a_completion_that_is_not_the_json_a_template_reads_scores_0() -> None:
    grader = check("eq", "{{sample.output_json.city}}", "{{item.city}}")
    assert grader.score('{"city": "Paris"}', {"city": "Paris"}) == 1.0
    assert grader.score("Paris", {"city": "Paris"}) == 0.0  # not JSON
    assert grader.score('{"town": "Paris"}', {"city": "Paris"}) == 0.0  # no such key
    assert grader.score('["Paris"]', {"city": "Paris"}) == 0.0  # not an object


def test_a_record_without_a_templated_field_fails_its_check() -> None:
    grader = check("eq", OUT, "{{item.meta.answer}}")
    grader.check({"meta": {"answer": "1"}})
    with pytest.raises(ValueError) as caught:
        grader.check({"meta": {"other": "1"}})
    assert str(caught.value) == (
        "the record has no 'meta.answer', which the grader's template {{item.meta.answer}} reads"
    )
    with pytest.raises(ValueError):
        grader.check({"meta": "flat"})


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{answer}}", "template {{answer}} names neither item.<field> nor sample.output_text"),
        ("{{items.answer}}", "template {{items.answer}} names neither"),
        ("{{item}}", "template {{item}} names neither"),
        ("{{sample.output}}", "template {{sample.output}}: a sample offers output_text and"),
        ("{{sample.output_text.x}}", "template {{sample.output_text.x}}: a sample offers"),
        ("{{item.a b}}", "template {{item.a b}} names neither"),
    ],
)
def test_templates_that_name_nothing_are_refused(template: str, message: str) -> None:
    said = refusal(
        {
            "type": "string_check",
            "name": "c",
            "input": template,
            "reference": ANSWER,
            "operation": "eq",
        }
    )
    assert message in said


def multi(formula: str, **graders: str) -> Grader:
    return openai(
        {
            "type": "multi",
            "name": "m",
            "graders": {
                name: {
                    "type": "string_check",
                    "name": name,
                    "input": OUT,
                    "reference": "{{item." + field + "}}",
                    "operation": "eq",
                }
                for name, field in graders.items()
            },
            "calculate_output": formula,
        }
    )


@pytest.mark.parametrize(
    ("formula", "a", "b", "value"),
    [
        ("0.25 * a + 0.75 * b", 1.0, 0.0, 0.25),
        ("0.25 * a + 0.75 * b", 0.0, 1.0, 0.75),
        ("min(a, b)", 1.0, 0.0, 0.0),
        ("max(a, b)", 1.0, 0.0, 1.0),
        ("(a + b) / 2", 1.0, 1.0, 1.0),
        ("a + b", 1.0, 1.0, 1.0),  # clipped to 1
        ("a - b", 0.0, 1.0, 0.0),  # clipped to 0
        ("-a + 1", 1.0, 0.0, 0.0),
        ("0.5 ^ 2 + a * 0", 0.0, 0.0, 0.25),  # ^ is a power, as OpenAI writes it
        ("sqrt(0.25) * a", 1.0, 0.0, 0.5),
        ("abs(a - b) / 4", 0.0, 1.0, 0.25),
        ("floor(0.9 + a) / 2", 1.0, 0.0, 0.5),
        ("ceil(0.1 * b) / 4", 0.0, 1.0, 0.25),
        ("exp(0) * 0.5 * b", 0.0, 1.0, 0.5),
        ("log(exp(0.5)) * a", 1.0, 0.0, 0.5),
    ],
)
def test_multi_computes_calculate_output_over_the_sub_scores(
    formula: str, a: float, b: float, value: float
) -> None:
    grader = multi(formula, a="x", b="y")
    record = {"x": "yes" if a else "no", "y": "yes" if b else "no"}
    scored = grader.grade("yes", record)
    assert math.isclose(scored.value, value, abs_tol=1e-12)
    assert scored.parts == {"a": a, "b": b}


def test_a_formula_that_fails_on_some_scores_is_the_graders_failure() -> None:
    grader = multi("a / b", a="x", b="y")
    assert grader.score("yes", {"x": "yes", "y": "yes"}) == 1.0
    with pytest.raises(ZeroDivisionError):
        grader.score("yes", {"x": "yes", "y": "no"})
    with pytest.raises(ValueError):
        multi("log(a)", a="x").score("yes", {"x": "no"})


@pytest.mark.parametrize(
    ("formula", "message"),
    [
        ('__import__("os")', "calculate_output may call min, max, abs, floor, ceil, exp, sqrt"),
        ("a.real", "calculate_output: Attribute is not allowed"),
        ("c + 1", "calculate_output names 'c', which is no grader of this multi (a, b)"),
        ("min + 1", "calculate_output names 'min', which is no grader"),
        ("min()", "calculate_output: min() takes numbers only"),
        ("max(a, key=b)", "calculate_output: max() takes numbers only"),
        ('"a"', "calculate_output: only numbers may appear as constants"),
        ("True", "calculate_output: only numbers may appear as constants"),
        ("a if b else 0", "calculate_output: IfExp is not allowed"),
        ("a < b", "calculate_output: Compare is not allowed"),
        ("a % b", "calculate_output: Mod is not allowed"),
        ("[a][0]", "calculate_output: Subscript is not allowed"),
        ("a +", "calculate_output 'a +' is not a formula"),
    ],
)
def test_formulas_that_do_more_than_arithmetic_are_refused(formula: str, message: str) -> None:
    leaf = {"type": "string_check", "input": OUT, "reference": ANSWER, "operation": "eq"}
    said = refusal(
        {
            "type": "multi",
            "name": "m",
            "graders": {"a": {**leaf, "name": "a"}, "b": {**leaf, "name": "b"}},
            "calculate_output": formula,
        }
    )
    assert message in said


def similar(metric: str, **extra: Any) -> Grader:
    return openai(
        {
            "type": "text_similarity",
            "name": "s",
            "input": OUT,
            "reference": ANSWER,
            "evaluation_metric": metric,
            **extra,
        }
    )


def test_text_similarity_scores_what_each_metrics_library_computes() -> None:
    from nltk.translate.gleu_score import sentence_gleu
    from rapidfuzz import fuzz
    from rouge_score import rouge_scorer
    from sacrebleu import sentence_bleu

    got, want = "the cat sat on a mat", "the cat sat on the mat"
    record = {"answer": want}
    expected = {
        "fuzzy_match": fuzz.ratio(got, want) / 100,
        "bleu": sentence_bleu(got, [want]).score / 100,
        "gleu": sentence_gleu([want.split()], got.split()),
        "rouge_1": rouge_scorer.RougeScorer(["rouge1"]).score(want, got)["rouge1"].fmeasure,
        "rouge_2": rouge_scorer.RougeScorer(["rouge2"]).score(want, got)["rouge2"].fmeasure,
        "rouge_l": rouge_scorer.RougeScorer(["rougeL"]).score(want, got)["rougeL"].fmeasure,
    }
    scores = {metric: similar(metric).score(got, record) for metric in expected}
    assert scores == pytest.approx(expected)
    # the hand-checkable ones: 5 of 6 unigrams shared; 3 of 5 bigrams
    assert scores["rouge_1"] == pytest.approx(5 / 6)
    assert scores["rouge_2"] == pytest.approx(3 / 5)
    assert similar("bleu").score(want, record) == pytest.approx(1.0)
    assert similar("fuzzy_match").score("abc", {"answer": "xyz"}) == 0.0


def test_a_pass_threshold_makes_the_similarity_pass_or_fail() -> None:
    record = {"answer": "the cat sat on the mat"}
    at = similar("rouge_1", pass_threshold=5 / 6)
    above = similar("rouge_1", pass_threshold=0.84)
    assert (
        at.score("the cat sat on a mat", record),
        above.score("the cat sat on a mat", record),
    ) == (
        1.0,
        0.0,
    )


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ("meteor", "meteor needs WordNet data, which pdppo does not download: use bleu"),
        ("cosine", "cosine needs an embedding model, which pdppo does not run"),
    ],
)
def test_metrics_without_a_local_implementation_are_refused(metric: str, message: str) -> None:
    said = refusal(
        {
            "type": "text_similarity",
            "name": "s",
            "input": OUT,
            "reference": ANSWER,
            "evaluation_metric": metric,
        }
    )
    assert message in said


def test_python_and_score_model_graders_are_refused_when_built() -> None:
    python = {"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 1.0\n"}
    with pytest.raises(ValueError) as caught:
        openai(python)
    assert str(caught.value).startswith(
        "task.grader.grader: python graders are off on this service"
    )
    score_model = {
        "type": "score_model",
        "name": "s",
        "model": "gpt-4o",
        "input": [{"role": "user", "content": "{{sample.output_text}}"}],
    }
    with pytest.raises(ValueError) as caught:
        openai(
            {
                "type": "multi",
                "name": "m",
                "graders": {"judge": score_model},
                "calculate_output": "judge",
            }
        )
    assert str(caught.value).startswith(
        "task.grader.grader.graders.judge: score_model graders need a model endpoint"
    )


def test_a_multi_of_in_process_graders_runs_in_process_and_one_with_similarity_does_not() -> None:
    assert multi("a", a="x").isolated is False
    assert similar("bleu").isolated is True


def test_the_documented_example_scores_as_its_formula_says() -> None:
    """docs/users/tasks-and-graders.md's OpenAI example, as a user would paste it."""
    doc = (Path(__file__).resolve().parents[2] / "docs/users/tasks-and-graders.md").read_text()
    example = doc.split("  grader:\n    type: openai\n", 1)[1].split("```", 1)[0]
    spec = yaml.safe_load("grader:\n    type: openai\n" + example)
    grader = build_grader(ADAPTER.validate_python(spec["grader"]))
    assert grader.grade("42", {"answer": "42"}).value == 1.0
    assert grader.grade("41", {"answer": "42"}).parts == {"exact": 0.0, "close": 0.5}
    assert grader.grade("41", {"answer": "42"}).value == 0.25


def test_a_batch_reports_each_sub_grader_and_counts_a_failing_formula_as_an_error() -> None:
    """In the trainer's process (string_check only) and in the grading server (with
    text_similarity), the batch's metrics hold `grader/<name>` per sub-grader; a formula that
    divides by zero scores 0 and counts in `grader_errors`."""
    from core.graders import BatchGrader

    leaf = {"type": "string_check", "input": OUT, "operation": "eq"}
    here = {
        "type": "multi",
        "name": "m",
        "graders": {
            "a": {**leaf, "name": "a", "reference": "{{item.x}}"},
            "b": {**leaf, "name": "b", "reference": "{{item.y}}"},
        },
        "calculate_output": "a / b",
    }
    served = {
        "type": "multi",
        "name": "m",
        "graders": {
            "a": {**leaf, "name": "a", "reference": "{{item.x}}"},
            "r": {
                "type": "text_similarity",
                "name": "r",
                "input": OUT,
                "reference": "{{item.y}}",
                "evaluation_metric": "rouge_1",
            },
        },
        "calculate_output": "0.5 * a + 0.5 * r",
    }
    records = [{"x": "a b", "y": "a b"}, {"x": "a b", "y": "c d"}, {"x": "no", "y": "a c"}]
    completions = ["a b", "a b", "a b"]
    with BatchGrader(ADAPTER.validate_python({"type": "openai", "grader": here}), 5.0) as batch:
        assert batch.server is None
        grades = batch.grade(completions, records)
    assert grades.rewards == [1.0, 0.0, 0.0]
    assert grades.metrics == pytest.approx(
        # the second and third divide by zero; a failed item's parts count 0
        {"grader_errors": 2 / 3, "grader_timeouts": 0.0, "grader/a": 1 / 3, "grader/b": 1 / 3}
    )
    # a minute per completion: the grading server's first rouge score imports its libraries,
    # which took over 5 s in a loaded CI run (two of three completions timed out and scored 0)
    with BatchGrader(ADAPTER.validate_python({"type": "openai", "grader": served}), 60.0) as batch:
        assert batch.server is not None
        grades = batch.grade(completions, records)
    assert grades.rewards == pytest.approx([1.0, 0.5, 0.25])
    assert grades.metrics == pytest.approx(
        {"grader_errors": 0.0, "grader_timeouts": 0.0, "grader/a": 2 / 3, "grader/r": 1.5 / 3}
    )


def test_the_limits_of_templates_and_sub_grader_names() -> None:
    def leaf(reference: str, name: str = "c") -> dict[str, Any]:
        return {
            "type": "string_check",
            "name": name,
            "input": OUT,
            "reference": reference,
            "operation": "eq",
        }

    longest = "x" * (10_000 - len(ANSWER)) + ANSWER
    ADAPTER.validate_python({"type": "openai", "grader": leaf(longest)})
    assert "at most 10000 characters" in refusal(leaf("x" + longest))
    name = "n" * 64
    formula = {"type": "multi", "name": "m", "calculate_output": name}
    ADAPTER.validate_python(
        {"type": "openai", "grader": {**formula, "graders": {name: leaf(ANSWER)}}}
    )
    said = refusal(
        {**formula, "calculate_output": name + "n", "graders": {name + "n": leaf(ANSWER)}}
    )
    assert "at most 64 characters" in said


def test_every_name_of_a_formula_is_checked_calls_arguments_included() -> None:
    leaf = {"type": "string_check", "input": OUT, "reference": ANSWER, "operation": "eq"}
    said = refusal(
        {
            "type": "multi",
            "name": "m",
            "graders": {"a": {**leaf, "name": "a"}},
            "calculate_output": "min(a, 1) + max(zzz, a)",
        }
    )
    assert "calculate_output names 'zzz', which is no grader of this multi (a)" in said


def test_graders_are_strict_a_number_in_a_string_is_not_a_number() -> None:
    grader = {
        "type": "text_similarity",
        "name": "s",
        "input": OUT,
        "reference": ANSWER,
        "evaluation_metric": "bleu",
    }
    ADAPTER.validate_python({"type": "openai", "grader": {**grader, "pass_threshold": 0.5}})
    assert refusal({**grader, "pass_threshold": "0.5"}) == "Input should be a valid number"
