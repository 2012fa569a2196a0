"""The grader part of the job spec (`core/config/graders.py`): each bound, at the last value it
accepts and the first it refuses, with the field and the message a user reads; the defaults a
spec that leaves a knob out trains with; what strict mode refuses; multi's own checks.

A bound one off does not crash anything, it quietly accepts a spec the documented schema refuses
(or refuses one it accepts), so the edges are pinned here rather than by a service test.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from core.config.graders import GraderConfig

CONFIG: TypeAdapter[GraderConfig] = TypeAdapter(GraderConfig)

MULTI_ONE = {"a": {"type": "string_check"}}
"""A multi grader's smallest `graders`, for the tests of its weights."""


def accepted(spec: dict[str, Any]) -> dict[str, Any]:
    return CONFIG.validate_python(spec).model_dump(by_alias=True)


def refusal(spec: dict[str, Any]) -> tuple[tuple[str | int, ...], str]:
    """(where, message) of the one error the spec gets."""
    with pytest.raises(ValidationError) as e:
        CONFIG.validate_python(spec)
    errors = e.value.errors()
    assert len(errors) == 1, errors
    return errors[0]["loc"], errors[0]["msg"]


def above(x: float) -> float:
    return math.nextafter(x, math.inf)


def below(x: float) -> float:
    return math.nextafter(x, -math.inf)


# (a spec builder, the last accepted value, the first refused one, where, message)
BOUNDS: list[tuple[str, Any, Any, Any, tuple[str | int, ...], str]] = [
    (
        "field name, longest",
        lambda v: {"type": "string_check", "field": v},
        "f" * 200,
        "f" * 201,
        ("string_check", "field"),
        "String should have at most 200 characters",
    ),
    (
        "field name, shortest",
        lambda v: {"type": "numeric", "field": v},
        "f",
        "",
        ("numeric", "field"),
        "String should have at least 1 character",
    ),
    (
        "regex pattern, longest",
        lambda v: {"type": "regex", "pattern": v},
        "a" * 2000,
        "a" * 2001,
        ("regex", "pattern"),
        "String should have at most 2000 characters",
    ),
    (
        "numeric extract, longest",
        lambda v: {"type": "numeric", "extract": v},
        "(" + "a" * 1998 + ")",
        "(" + "a" * 1999 + ")",
        ("numeric", "extract"),
        "String should have at most 2000 characters",
    ),
    (
        "tolerance, largest",
        lambda v: {"type": "numeric", "tolerance": v},
        1e12,
        above(1e12),
        ("numeric", "tolerance"),
        "Input should be less than or equal to 1000000000000",
    ),
    (
        "tolerance, smallest",
        lambda v: {"type": "numeric", "tolerance": v},
        0.0,
        below(0.0),
        ("numeric", "tolerance"),
        "Input should be greater than or equal to 0",
    ),
    (
        "relative tolerance, largest",
        lambda v: {"type": "numeric", "relative_tolerance": v},
        1.0,
        above(1.0),
        ("numeric", "relative_tolerance"),
        "Input should be less than or equal to 1",
    ),
    (
        "relative tolerance, smallest",
        lambda v: {"type": "numeric", "relative_tolerance": v},
        0.0,
        below(0.0),
        ("numeric", "relative_tolerance"),
        "Input should be greater than or equal to 0",
    ),
    (
        "length penalty, longest",
        lambda v: {"type": "length_penalty", "max_chars": v},
        1_000_000,
        1_000_001,
        ("length_penalty", "max_chars"),
        "Input should be less than or equal to 1000000",
    ),
    (
        "length penalty, shortest",
        lambda v: {"type": "length_penalty", "max_chars": v},
        1,
        0,
        ("length_penalty", "max_chars"),
        "Input should be greater than or equal to 1",
    ),
    (
        "plugin name, longest",
        lambda v: {"type": "plugin", "name": v},
        "p" * 200,
        "p" * 201,
        ("plugin", "name"),
        # a CleanStr's wrap validator makes pydantic count the length as of a sequence
        "Value should have at most 200 items after validation, not 201",
    ),
    (
        "plugin name, shortest",
        lambda v: {"type": "plugin", "name": v},
        "p",
        "",
        ("plugin", "name"),
        "Value should have at least 1 item after validation, not 0",
    ),
    (
        "sub-grader name, longest",
        lambda v: {"type": "multi", "graders": {v: {"type": "string_check"}}},
        "g" * 64,
        "g" * 65,
        ("multi", "graders", "g" * 65, "[key]"),
        "String should have at most 64 characters",
    ),
    (
        "sub-grader name, shortest",
        lambda v: {"type": "multi", "graders": {v: {"type": "string_check"}}},
        "g",
        "",
        ("multi", "graders", "", "[key]"),
        "String should have at least 1 character",
    ),
    (
        "sub-graders, most",
        lambda n: {"type": "multi", "graders": {f"g{i}": {"type": "math"} for i in range(n)}},
        32,
        33,
        ("multi", "graders"),
        "Dictionary should have at most 32 items after validation, not more",
    ),
    (
        "sub-graders, fewest",
        lambda n: {"type": "multi", "graders": {f"g{i}": {"type": "math"} for i in range(n)}},
        1,
        0,
        ("multi", "graders"),
        "Dictionary should have at least 1 item after validation, not 0",
    ),
    (
        "weight, largest",
        lambda v: {"type": "multi", "graders": MULTI_ONE, "weights": {"a": v}},
        1e6,
        above(1e6),
        ("multi", "weights", "a"),
        "Input should be less than or equal to 1000000",
    ),
    (
        "weight, smallest",
        lambda v: {
            "type": "multi",
            "graders": MULTI_ONE | {"b": {"type": "math"}},
            "weights": {"a": v},
        },
        0.0,
        below(0.0),
        ("multi", "weights", "a"),
        "Input should be greater than or equal to 0",
    ),
]


@pytest.mark.parametrize(
    ("build", "last_accepted", "first_refused", "where", "message"),
    [pytest.param(*b[1:], id=b[0]) for b in BOUNDS],
)
def test_each_bound_accepts_its_edge_and_refuses_the_next_value(
    build: Any,
    last_accepted: Any,
    first_refused: Any,
    where: tuple[str | int, ...],
    message: str,
) -> None:
    accepted(build(last_accepted))
    assert refusal(build(first_refused)) == (where, message)


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"type": "string_check", "field": "2nd"}, ("string_check", "field")),
        ({"type": "string_check", "field": "a b"}, ("string_check", "field")),
        (
            {"type": "multi", "graders": {"a.b": {"type": "math"}}},
            ("multi", "graders", "a.b", "[key]"),
        ),
    ],
)
def test_names_outside_their_pattern_are_refused(spec: dict[str, Any], where: tuple) -> None:
    loc, msg = refusal(spec)
    assert loc == where and msg.startswith("String should match pattern")


def test_a_field_name_may_hold_dots_and_dashes_and_a_grader_name_dashes() -> None:
    assert accepted({"type": "string_check", "field": "_meta.answer-1"})["field"] == (
        "_meta.answer-1"
    )
    assert list(accepted({"type": "multi", "graders": {"is-short": {"type": "math"}}})["graders"])
    assert list(accepted({"type": "multi", "graders": {"_x2": {"type": "math"}}})["graders"])


@pytest.mark.parametrize(
    ("spec", "dumped"),
    [
        (
            {"type": "string_check"},
            {
                "type": "string_check",
                "operation": "equals",
                "case_sensitive": True,
                "field": "answer",
            },
        ),
        (
            {"type": "regex"},
            {
                "type": "regex",
                "pattern": None,
                "field": "answer",
                "mode": "fullmatch",
                "case_sensitive": True,
            },
        ),
        (
            {"type": "numeric"},
            {
                "type": "numeric",
                "field": "answer",
                "extract": None,
                "tolerance": 1e-6,
                "relative_tolerance": 0.0,
            },
        ),
        ({"type": "math"}, {"type": "math", "field": "answer"}),
        ({"type": "json_schema"}, {"type": "json_schema", "schema": None, "field": "schema"}),
        ({"type": "plugin", "name": "p"}, {"type": "plugin", "name": "p", "options": {}}),
        (
            {"type": "multi", "graders": {"m": {"type": "math"}}},
            {"type": "multi", "graders": {"m": {"type": "math", "field": "answer"}}, "weights": {}},
        ),
    ],
)
def test_the_defaults_a_spec_that_leaves_knobs_out_gets(
    spec: dict[str, Any], dumped: dict[str, Any]
) -> None:
    assert accepted(spec) == dumped


@pytest.mark.parametrize(
    ("spec", "where", "message"),
    [
        (
            {"type": "string_check", "case_sensitive": "false"},
            ("string_check", "case_sensitive"),
            "Input should be a valid boolean",
        ),
        (
            {"type": "length_penalty", "max_chars": "100"},
            ("length_penalty", "max_chars"),
            "Input should be a valid integer",
        ),
        (
            {"type": "numeric", "tolerance": "0.5"},
            ("numeric", "tolerance"),
            "Input should be a valid number",
        ),
        (
            {"type": "string_check", "ignore_case": True},
            ("string_check", "ignore_case"),
            "Extra inputs are not permitted",
        ),
        (
            {"type": "numeric", "tolerance": math.nan},
            ("numeric", "tolerance"),
            "must be finite (got NaN)",
        ),
    ],
)
def test_strict_mode_coerces_nothing_and_takes_no_unknown_key(
    spec: dict[str, Any], where: tuple, message: str
) -> None:
    assert refusal(spec) == (where, message)


def test_multis_own_checks_run_and_a_small_positive_sum_is_enough() -> None:
    graders = {"a": {"type": "string_check"}, "b": {"type": "math"}}
    assert refusal({"type": "multi", "graders": graders, "weights": {"c": 1.0}}) == (
        ("multi",),
        "Value error, weights name no sub-grader: ['c']",
    )
    assert refusal({"type": "multi", "graders": graders, "weights": {"a": 0.0, "b": 0.0}}) == (
        ("multi",),
        "Value error, the weights of the sub-graders sum to 0",
    )
    # a sum below 1 is still a sum above 0: the check is `<= 0`, not `< 1`
    tiny = {"type": "multi", "graders": graders, "weights": {"a": 0.25, "b": 0.25}}
    assert accepted(tiny)["weights"] == {"a": 0.25, "b": 0.25}
    # one sub-grader left unweighted weighs 1: the sum is not 0
    assert accepted({"type": "multi", "graders": graders, "weights": {"a": 0.0}})["weights"] == {
        "a": 0.0
    }


@pytest.mark.parametrize(
    ("length", "shown"),
    [(79, "(" * 79), (80, "(" * 80), (81, "(" * 80 + "…")],
)
def test_a_refused_pattern_is_shown_whole_up_to_80_characters(length: int, shown: str) -> None:
    where, message = refusal({"type": "regex", "pattern": "(" * length})
    assert where == ("regex", "pattern")
    assert message.startswith(f"Value error, {shown!r} is not a regex (missing ), ")
