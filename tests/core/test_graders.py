"""Graders on hand-written cases, and the grading server under graders that hang, raise, crash
or print.

Plugins are real entry points: a tiny distribution (a module and its `*.dist-info`) written to a
folder that is put on `sys.path` (for this process) and on `PYTHONPATH` (for the grading server),
the same way an operator can serve an unpackaged plugin.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

import core.graders.batch
import core.graders.plugins
import core.graders.schema
from core.config.graders import GraderConfig
from core.graders import BatchGrader, GradingServer, build_grader, installed_plugins
from core.graders.base import Grader, check_unit, text_field
from core.graders.batch import GradingCounts
from tests.core.plugins import install_plugins

CONFIG: TypeAdapter[GraderConfig] = TypeAdapter(GraderConfig)


def grader_config(spec: dict[str, Any]) -> GraderConfig:
    return CONFIG.validate_python(spec)


def score(spec: dict[str, Any], completion: str, record: dict[str, Any] | None = None) -> float:
    return build_grader(grader_config(spec)).score(completion, record or {})


# -- plugins: a real entry point ---------------------------------------------------------------

PLUGIN_MODULE = """
import math, os, sys, time

def half(completion, record, **options):
    return 0.5

def scaled(completion, record, factor=1.0):
    return len(completion) * factor

def nan(completion, record):
    return math.nan

def text(completion, record):
    return "1"

def boom(completion, record):
    raise RuntimeError("plugin exploded on " + completion)

def sleep_forever(completion, record):
    if completion == "hang":
        time.sleep(3600)
    return 1.0

def chatty(completion, record):
    print("not a protocol line", flush=True)
    os.write(1, b"{\\"i\\": 99}\\n")
    return 1.0

def die(completion, record):
    if completion == "die":
        os._exit(3)
    return 1.0

def torch_loaded(completion, record):
    return float("torch" in sys.modules)

NOT_A_FUNCTION = 0.5

FORGED = b'{"i": 99, "pad": "' + b"x" * 300 + b'"}\\n'

def forge(completion, record):
    # writes a protocol line into the answers pipe it inherited (a write-only pipe past
    # stderr): what a plugin that scribbles on file descriptors can do
    import fcntl, stat
    err = os.fstat(2)
    for fd in range(3, 64):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if not stat.S_ISFIFO(st.st_mode) or (st.st_dev, st.st_ino) == (err.st_dev, err.st_ino):
            continue
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
            os.write(fd, FORGED)
    return 1.0
"""

PLUGINS = [
    "boom",
    "chatty",
    "constant",
    "die",
    "forge",
    "half",
    "nan",
    "scaled",
    "sleep",
    "text",
    "torch_loaded",
]


@pytest.fixture(scope="session")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    functions = {name: name for name in PLUGINS} | {
        "sleep": "sleep_forever",
        "constant": "NOT_A_FUNCTION",
    }
    root = tmp_path_factory.mktemp("plugins")
    return install_plugins(root, "pdppo_test_graders", PLUGIN_MODULE, functions)


@pytest.fixture
def plugins(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(plugin_dir))
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugin_dir), path])))


# -- the graders, one by one -------------------------------------------------------------------


def test_string_check() -> None:
    record = {"answer": " Paris "}
    assert score({"type": "string_check"}, "Paris\n", record) == 1.0
    assert score({"type": "string_check"}, "paris", record) == 0.0
    assert score({"type": "string_check", "case_sensitive": False}, "PARIS", record) == 1.0
    contains = {"type": "string_check", "operation": "contains"}
    assert score(contains, "It is Paris.", record) == 1.0
    assert score(contains, "It is Lyon.", record) == 0.0
    assert score({"type": "string_check", "field": "n"}, "42", {"n": 42}) == 1.0


def test_regex_fixed_or_from_the_record() -> None:
    fixed = {"type": "regex", "pattern": r"\d+ apples"}
    assert score(fixed, " 12 apples ") == 1.0
    assert score(fixed, "I have 12 apples") == 0.0  # fullmatch
    assert score(fixed | {"mode": "search"}, "I have 12 apples") == 1.0
    assert score(fixed | {"case_sensitive": False}, "12 APPLES") == 1.0
    record = {"answer": "h(i|ello)!?"}
    assert score({"type": "regex"}, "hello!", record) == 1.0
    assert score({"type": "regex"}, "oh hi", record) == 0.0
    # a fixed pattern that does not compile never validates (tests/client/test_spec_checks.py)
    with pytest.raises(ValidationError, match=r"'\(' is not a regex \(missing \)"):
        grader_config({"type": "regex", "pattern": "("})
    with pytest.raises(ValueError, match="field 'answer' is not a regex"):
        build_grader(grader_config({"type": "regex"})).check({"answer": "(a"})


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("The total is 1,234 dollars.", "1234", 1.0),
        ("1,234,567", 1234567, 1.0),
        ("first 3, then 4", "4", 1.0),  # the last number
        ("first 4, then 3", "4", 0.0),
        ("x = 5-3 = 2", 2, 1.0),  # "-3" is not a negative number here
        ("it is -2.5e1", "-25", 1.0),
        ("The answer is 42.", "42", 1.0),
        ("no number at all", "0", 0.0),
        ("it is .5", 0.5, 1.0),
    ],
)
def test_numeric_takes_the_last_number(completion: str, reference: Any, expected: float) -> None:
    assert score({"type": "numeric"}, completion, {"answer": reference}) == expected


def test_numeric_tolerances_and_extract() -> None:
    record = {"answer": 100}
    assert score({"type": "numeric", "tolerance": 0.5}, "100.4", record) == 1.0
    assert score({"type": "numeric", "tolerance": 0.5}, "100.6", record) == 0.0
    assert score({"type": "numeric", "relative_tolerance": 0.01}, "101", record) == 1.0
    assert score({"type": "numeric", "relative_tolerance": 0.01}, "101.5", record) == 0.0
    extract = {"type": "numeric", "extract": r"ANSWER: ([\d,.]+)"}
    assert score(extract, "ANSWER: 1,000 then 100 more", {"answer": 1000}) == 1.0
    assert score(extract, "100", record) == 0.0  # the pattern does not match: no answer
    # a completion that states its answer twice (a correction) is graded on the last one
    corrected = "ANSWER: 7, no wait, ANSWER: 9"
    assert [score(extract, corrected, {"answer": n}) for n in (7, 9)] == [0.0, 1.0]
    with pytest.raises(ValidationError, match=r"'\[0-9\]\+' must have exactly one group"):
        grader_config({"type": "numeric", "extract": "[0-9]+"})
    with pytest.raises(ValueError, match=r"field 'answer'='1/2' is not a finite number"):
        build_grader(grader_config({"type": "numeric"})).check({"answer": "1/2"})
    assert not build_grader(grader_config({"type": "numeric"})).isolated
    assert build_grader(grader_config(extract)).isolated


def test_a_grader_class_without_a_score_cannot_be_built() -> None:
    """A new grader that forgot `score` fails when it is built (the spec's load), not with a
    None reward in the middle of a run."""

    class NoScore(Grader):
        pass

    with pytest.raises(TypeError, match=r"abstract method '?score"):
        NoScore()  # type: ignore[abstract]


@pytest.mark.parametrize("value", [0.0, 0.5, 1.0])
def test_a_score_in_the_unit_interval_is_kept(value: float) -> None:
    assert check_unit(value, "g") == value


@pytest.mark.parametrize("value", [-0.01, 1.01, float("nan"), float("inf"), -float("inf")])
def test_a_score_outside_the_unit_interval_is_the_graders_bug(value: float) -> None:
    with pytest.raises(ValueError, match=r"^g returned .*, not a number in \[0, 1\]$"):
        check_unit(value, "g")


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "null"),
        (True, "a boolean"),
        ([1], "an array"),
        ({"a": 1}, "an object"),
        (1j, "complex"),
    ],
)
def test_a_text_field_of_another_kind_is_named(value: object, kind: str) -> None:
    with pytest.raises(
        ValueError, match=f"^field 'answer' must be a string or a number, not {kind}$"
    ):
        text_field({"answer": value}, "answer")
    assert text_field({"answer": 4}, "answer") == "4"
    assert text_field({"answer": 0.5}, "answer") == "0.5"


@pytest.mark.parametrize(
    ("tolerances", "completion", "reference", "expected"),
    [
        # on the edge is within: |100.5 - 100| is 0.5 exactly in binary
        ({"tolerance": 0.5}, "100.5", 100, 1.0),
        ({"tolerance": 0.5}, "99.5", 100, 1.0),
        ({"tolerance": 0.5}, "100.5", -100, 0.0),  # the sign counts
        ({"tolerance": 0.5}, "-100.5", -100, 1.0),
        # relative to the reference's size, whatever its sign: 1% of -100 is 1
        ({"relative_tolerance": 0.01}, "-101", -100, 1.0),
        ({"relative_tolerance": 0.01}, "-99", -100, 1.0),
        ({"relative_tolerance": 0.01}, "-98.5", -100, 0.0),
        ({"relative_tolerance": 0.01}, "99", -100, 0.0),
        ({"relative_tolerance": 0.5}, "0.5", 0, 0.0),  # relative to 0 is exact
        # either tolerance accepts: 0.9 is within 1% of 100, 0.4 within 0.5
        ({"tolerance": 0.5, "relative_tolerance": 0.01}, "100.9", 100, 1.0),
        ({"tolerance": 0.5, "relative_tolerance": 0.001}, "99.6", 100, 1.0),
        ({"tolerance": 0.5, "relative_tolerance": 0.001}, "99.4", 100, 0.0),
        # the default: 1e-6 absolute, nothing relative
        ({}, "1000000.000001", 1_000_000, 0.0),
        ({}, "3.0000005", 3, 1.0),
        ({}, "3.000002", 3, 0.0),
    ],
)
def test_numeric_tolerance_edges(
    tolerances: dict[str, float], completion: str, reference: float, expected: float
) -> None:
    spec = {"type": "numeric", **tolerances}
    assert score(spec, completion, {"answer": reference}) == expected


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("0.5", "1/2", 1.0),
        ("\\frac{1}{2}", "0.5", 1.0),
        ("1/2", "\\frac{1}{2}", 1.0),
        ("So the probability is $\\boxed{\\frac12}$.", "0.5", 1.0),
        ("We get \\boxed{(x+1)^2}", "x^2+2x+1", 1.0),  # a bare expression reference
        ("The answer is \\boxed{3}, not 1/2", "1/2", 0.0),  # the boxed answer is final
        ("\\boxed{0.25}", "1/2", 0.0),
        ("I do not know", "1/2", 0.0),
    ],
)
def test_math_equivalence(completion: str, reference: str, expected: float) -> None:
    assert score({"type": "math"}, completion, {"answer": reference}) == expected


def test_math_reference_without_an_answer_is_an_error() -> None:
    with pytest.raises(ValueError, match="math-verify reads no answer in field 'answer'"):
        score({"type": "math"}, "\\boxed{1}", {"answer": "  "})


def test_json_schema() -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    fixed = {"type": "json_schema", "schema": schema}
    assert score(fixed, ' {"n": 3} ') == 1.0
    assert score(fixed, '{"n": "3"}') == 0.0
    assert score(fixed, "{n: 3}") == 0.0  # not JSON
    assert score(fixed, "[" * 100_000) == 0.0  # too deep for the parser: still just wrong
    assert score({"type": "json_schema"}, "[1, 2]", {"schema": {"type": "array"}}) == 1.0
    with pytest.raises(ValidationError, match=r"not a valid JSON schema: 12 is not valid under"):
        grader_config({"type": "json_schema", "schema": {"type": 12}})
    grader = build_grader(grader_config({"type": "json_schema"}))
    with pytest.raises(ValueError, match=r"field 'schema' is not a valid JSON schema: .*'/type'"):
        grader.check({"schema": {"type": "integr"}})
    with pytest.raises(ValueError, match="has no field 'schema'"):
        grader.check({"answer": "x"})


def test_json_schema_validators_are_cached_and_the_least_recently_used_goes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group's completions share a schema: compiled once while it is among the most recently
    used, compiled again once evicted."""
    import jsonschema.validators

    compiled: list[str] = []
    validator_for = jsonschema.validators.validator_for

    def counting(schema: Any, *args: Any, **kwargs: Any) -> Any:
        compiled.append(schema["title"])
        return validator_for(schema, *args, **kwargs)

    grader = build_grader(grader_config({"type": "json_schema"}))
    monkeypatch.setattr(core.graders.schema, "MAX_CACHED_VALIDATORS", 2)
    monkeypatch.setattr(jsonschema.validators, "validator_for", counting)
    schemas = {name: {"title": name, "type": "integer"} for name in "abc"}
    reordered = {"type": "integer", "title": "a"}  # the same schema: the same cache entry
    for schema in [schemas["a"], schemas["b"], reordered, schemas["c"], schemas["a"], schemas["b"]]:
        assert grader.score("3", {"schema": schema}) == 1.0
    # a, b; a again (cached); c evicts b, the least recently used; a again (cached); b again
    assert compiled == ["a", "b", "c", "b"]


def test_a_long_schema_error_is_cut_at_300_characters() -> None:
    grader = build_grader(grader_config({"type": "json_schema"}))
    with pytest.raises(ValueError) as e:
        grader.check({"schema": {"type": "x" * 400}})
    assert str(e.value) == (
        "field 'schema' is not a valid JSON schema: '" + "x" * 299 + " (at '/type')"
    )


def test_length_penalty() -> None:
    spec = {"type": "length_penalty", "max_chars": 10}
    assert [score(spec, "x" * n) for n in (0, 10, 15, 20, 30)] == [1.0, 1.0, 0.5, 0.0, 0.0]


def test_multi_weighted_mean_and_parts() -> None:
    spec = {
        "type": "multi",
        "graders": {
            "right": {"type": "string_check", "operation": "contains"},
            "short": {"type": "length_penalty", "max_chars": 10},
            "exact": {"type": "string_check"},
        },
        "weights": {"right": 3.0, "short": 1.0, "exact": 0.0},  # watched, not rewarded
    }
    grader = build_grader(grader_config(spec))
    scored = grader.grade("it is 4 , ok", {"answer": "4"})  # 12 chars: length score 0.8
    assert scored.parts == pytest.approx({"right": 1.0, "short": 0.8, "exact": 0.0})
    assert scored.value == pytest.approx((3 * 1.0 + 0.8) / 4)
    with BatchGrader(grader_config(spec), 5.0) as batch:
        assert batch.server is None  # only in-process graders
        graded = batch.grade(["4", "it is 5 , ok"], [{"answer": "4"}, {"answer": "4"}])
    assert graded.rewards == pytest.approx([1.0, 0.8 / 4])
    assert graded.metrics == pytest.approx(
        {
            "grader_errors": 0.0,
            "grader_timeouts": 0.0,
            "grader/right": 0.5,
            "grader/short": 0.9,
            "grader/exact": 0.5,
        }
    )


def test_in_process_errors_score_0_and_count() -> None:
    with BatchGrader(grader_config({"type": "string_check"}), 5.0) as batch:
        graded = batch.grade(["a", "a", "b", "a"], [{"answer": "a"}, {}, {"answer": "a"}, {}])
    assert graded.rewards == [1.0, 0.0, 0.0, 0.0]
    assert graded.metrics == {"grader_errors": 0.5, "grader_timeouts": 0.0}


def test_a_sub_grader_without_a_weight_weighs_1() -> None:
    spec = {
        "type": "multi",
        "graders": {
            "right": {"type": "string_check", "operation": "contains"},
            "short": {"type": "length_penalty", "max_chars": 10},
        },
        "weights": {"right": 3.0},
    }
    scored = build_grader(grader_config(spec)).grade("4" * 15, {"answer": "4"})  # short: 0.5
    assert scored.parts == {"right": 1.0, "short": 0.5}
    assert scored.value == (3 * 1.0 + 1 * 0.5) / 4


def test_a_failed_items_parts_count_as_0_in_the_part_metrics() -> None:
    spec = {
        "type": "multi",
        "graders": {
            "right": {"type": "string_check"},
            "short": {"type": "length_penalty", "max_chars": 10},
        },
    }
    with BatchGrader(grader_config(spec), 5.0) as batch:
        graded = batch.grade(["a", "a"], [{"answer": "a"}, {}])  # the second has no answer
    assert graded.rewards == [1.0, 0.0]
    assert graded.metrics == {
        "grader_errors": 0.5,
        "grader_timeouts": 0.0,
        "grader/right": 0.5,
        "grader/short": 0.5,
    }


def test_grading_counts_are_taken_once() -> None:
    counts = GradingCounts()
    assert counts.take() == {"completions": 0, "errors": 0, "timeouts": 0}
    counts.add(4, 1, 2)
    counts.add(3, 0, 1)
    assert counts.take() == {"completions": 7, "errors": 1, "timeouts": 3}
    assert counts.take() == {"completions": 0, "errors": 0, "timeouts": 0}


def test_each_distinct_grader_error_is_logged_once_up_to_a_limit(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core.graders.batch, "MAX_LOGGED_ERRORS", 2)
    spec = {"type": "string_check", "field": "a"}
    with (
        caplog.at_level("WARNING", logger="core.graders.batch"),
        BatchGrader(grader_config(spec), 5.0) as batch,
    ):
        batch.grade(["x", "x", "x"], [{}, {}, {"a": "x"}])  # one message, twice
        batch.grade(["x", "x", "x"], [{"b": 1}, {"a": None}, {"a": True}])  # and two more
    prefix = "a completion scored 0: grader error: ValueError: "
    assert [r.getMessage() for r in caplog.records] == [
        prefix + "the record has no field 'a', which the grader reads",
        prefix + "field 'a' must be a string or a number, not null",
    ]  # the third distinct message is past the limit of 2


# -- plugins -----------------------------------------------------------------------------------


@pytest.mark.usefixtures("plugins")
def test_only_the_grading_server_imports_a_plugin() -> None:
    spec = grader_config({"type": "plugin", "name": "half"})
    here = build_grader(spec)  # the trainer's process: the name is checked, nothing imported
    with pytest.raises(RuntimeError, match="plugin 'half' runs in the grading server only"):
        here.score("x", {})
    assert build_grader(spec, load_plugins=True).score("x", {}) == 0.5
    multi = grader_config({"type": "multi", "graders": {"h": {"type": "plugin", "name": "half"}}})
    with pytest.raises(RuntimeError, match="runs in the grading server only"):
        build_grader(multi).score("x", {})
    assert build_grader(multi, load_plugins=True).score("x", {}) == 0.5


@pytest.mark.usefixtures("plugins")
def test_a_plugins_result_is_clipped_to_the_unit_interval() -> None:
    def scaled(factor: float) -> float:
        spec = grader_config({"type": "plugin", "name": "scaled", "options": {"factor": factor}})
        return build_grader(spec, load_plugins=True).score("abcd", {})

    assert [scaled(f) for f in (-1.0, 0.125, 1.0)] == [0.0, 0.5, 1.0]


def test_multi_checks_each_records_fields_for_every_sub_grader() -> None:
    """A record a sub-grader cannot read is refused when the dataset is loaded, naming the
    field, whichever sub-grader reads it."""
    spec = {
        "type": "multi",
        "graders": {
            "short": {"type": "length_penalty", "max_chars": 10},
            "right": {"type": "numeric", "field": "solution"},
        },
    }
    grader = build_grader(grader_config(spec))
    grader.check({"solution": 4})
    with pytest.raises(ValueError, match="the record has no field 'solution'"):
        grader.check({"answer": 4})


def test_multi_refuses_weights_of_no_sub_grader_and_a_zero_sum() -> None:
    graders = {"a": {"type": "string_check"}, "b": {"type": "length_penalty", "max_chars": 5}}
    with pytest.raises(ValueError, match=r"weights name no sub-grader: \['c'\]"):
        grader_config({"type": "multi", "graders": graders, "weights": {"c": 1.0}})
    with pytest.raises(ValueError, match="the weights of the sub-graders sum to 0"):
        grader_config({"type": "multi", "graders": graders, "weights": {"a": 0.0, "b": 0.0}})


@pytest.mark.usefixtures("plugins")
def test_unknown_plugin_lists_the_installed_ones() -> None:
    assert set(PLUGINS) <= set(installed_plugins())
    spec = {"type": "multi", "graders": {"code": {"type": "plugin", "name": "nope"}}}
    with pytest.raises(ValueError) as e:
        build_grader(grader_config(spec))
    message = str(e.value)
    assert message.startswith(
        "task.grader.graders.code.name='nope': no grader plugin of that name is installed "
        "(entry point group 'pdppo.graders'; installed: ["
    )
    assert "'sleep'" in message and "'half'" in message


@pytest.mark.usefixtures("plugins")
def test_a_plugin_gone_by_the_time_the_grading_server_loads_it_lists_the_installed() -> None:
    """The trainer checked the name; the grading server (another process, maybe after an
    uninstall) loads it: a missing one is the same clear error there, not an IndexError."""
    with pytest.raises(ValueError) as e:
        core.graders.plugins.load_plugin("gone", "task.grader")
    message = str(e.value)
    assert message.startswith(
        "task.grader.name='gone': no grader plugin of that name is installed (entry point "
        "group 'pdppo.graders'; installed: ["
    )
    assert "'boom'" in message and "'half'" in message


@pytest.mark.usefixtures("plugins")
def test_an_entry_point_that_is_not_a_function_is_named_when_loaded() -> None:
    spec = grader_config({"type": "plugin", "name": "constant"})
    build_grader(spec)  # the trainer's process only checks that it is installed
    with pytest.raises(ValueError) as e:
        build_grader(spec, load_plugins=True)
    assert str(e.value) == (
        "task.grader.name='constant': entry point 'pdppo_test_graders:NOT_A_FUNCTION' is not "
        "callable"
    )


@pytest.mark.usefixtures("plugins")
def test_plugins_in_the_grading_server() -> None:
    spec = {
        "type": "multi",
        "graders": {
            "half": {"type": "plugin", "name": "half"},
            "scaled": {"type": "plugin", "name": "scaled", "options": {"factor": 0.25}},
            "no_torch": {"type": "plugin", "name": "torch_loaded"},
        },
    }
    with BatchGrader(grader_config(spec), 10.0) as batch:
        assert batch.server is not None
        graded = batch.grade(["ab", "abcdefgh"], [{}, {}])
    # scaled: 0.5, then 2.0 clipped to 1; the server never imported torch
    assert graded.rewards == pytest.approx([(0.5 + 0.5 + 0) / 3, (0.5 + 1.0 + 0) / 3])
    assert graded.metrics["grader/no_torch"] == 0.0
    assert graded.metrics["grader/scaled"] == pytest.approx(0.75)
    assert graded.metrics["grader_errors"] == 0.0


@pytest.mark.usefixtures("plugins")
def test_a_json_schema_grader_keeps_its_fixed_schema_in_the_grading_server() -> None:
    """The config crosses to the grading server as JSON, and `schema` is an alias: the child
    must build the same grader, with its fixed schema (a survivor of CI's mutation sample sent
    the field's own name, which the child's strict config refuses)."""
    spec = {
        "type": "multi",
        "graders": {
            "json": {"type": "json_schema", "schema": {"type": "array"}},
            "half": {"type": "plugin", "name": "half"},
        },
    }
    with BatchGrader(grader_config(spec), 10.0) as batch:
        assert batch.server is not None
        graded = batch.grade(["[1, 2]", "{}"], [{}, {}])
    assert graded.rewards == pytest.approx([(1.0 + 0.5) / 2, (0.0 + 0.5) / 2])
    assert graded.metrics["grader_errors"] == 0.0


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("boom", "RuntimeError: plugin exploded on x"),
        ("nan", "ValueError: plugin 'nan' returned nan, not a finite number"),
        ("text", "TypeError: plugin 'text' returned str, not a number"),
    ],
)
def test_a_failing_plugin_counts_in_grader_errors(name: str, message: str) -> None:
    server = GradingServer(grader_config({"type": "plugin", "name": name}), 10.0)
    with server:
        [outcome] = server.grade([("x", {})])
    assert (outcome.value, outcome.failure, outcome.message) == (0.0, "error", message)


@pytest.mark.usefixtures("plugins")
def test_a_hanging_plugin_times_out_and_the_rest_is_graded() -> None:
    with BatchGrader(grader_config({"type": "plugin", "name": "sleep"}), 2.0) as batch:
        assert batch.server is not None
        t0 = time.monotonic()
        graded = batch.grade(["ok", "hang", "ok", "ok"], [{}] * 4)
        elapsed = time.monotonic() - t0
        assert batch.server.starts == 2  # killed once, restarted once
    assert graded.rewards == [1.0, 0.0, 1.0, 1.0]
    assert graded.metrics == {"grader_errors": 0.0, "grader_timeouts": 0.25}
    assert 2.0 <= elapsed < 15.0


@pytest.mark.usefixtures("plugins")
def test_a_plugin_that_kills_the_server_or_prints() -> None:
    with GradingServer(grader_config({"type": "plugin", "name": "die"}), 10.0) as server:
        outcomes = server.grade([("die", {}), ("fine", {})])
    assert [o.value for o in outcomes] == [0.0, 1.0]
    assert outcomes[0].failure == "error"
    assert outcomes[0].message == "the grading server died (exit status 3)"
    with GradingServer(grader_config({"type": "plugin", "name": "chatty"}), 10.0) as server:
        outcomes = server.grade([("a", {}), ("b", {})])
    assert [(o.value, o.failure) for o in outcomes] == [(1.0, None), (1.0, None)]


@pytest.mark.usefixtures("plugins")
def test_an_answer_out_of_order_stops_the_server_and_is_quoted_up_to_200_bytes() -> None:
    with GradingServer(grader_config({"type": "plugin", "name": "forge"}), 10.0) as server:
        outcomes = server.grade([("a", {}), ("b", {})])
        assert server.starts == 2  # the forged answer stopped the first child
    forged = b'{"i": 99, "pad": "' + b"x" * 300 + b'"}'
    message = f"unexpected answer {forged[:200]!r}"
    assert [(o.value, o.failure, o.message) for o in outcomes] == [(0.0, "error", message)] * 2


# -- the grading server ------------------------------------------------------------------------


def test_the_last_second_before_a_deadline_still_counts() -> None:
    """A write or a read with half a second left goes through when the child is ready: the
    deadline is when they give up, not a second before it."""
    from core.graders.server import _Child

    child = _Child()
    child.start()
    try:
        setup = {"grader": {"type": "regex", "pattern": "a"}, "where": "task.grader"}
        assert child.write(json.dumps(setup).encode() + b"\n", time.monotonic() + 0.5)
        assert child.read_line(time.monotonic() + 60.0) == b'{"ready":true}'
        batch = {"records": [{}], "items": [[0, "a"]]}
        assert child.write(json.dumps(batch).encode() + b"\n", time.monotonic() + 60.0)
        assert child.proc is not None and child.proc.stdout is not None
        ready, _, _ = select.select([child.proc.stdout], [], [], 60.0)  # the answer is there
        assert ready
        assert child.read_line(time.monotonic() + 0.5) == b'{"i":0,"v":1.0,"p":{}}'
    finally:
        child.stop()


def test_catastrophic_regex_times_out_and_the_next_item_is_graded() -> None:
    spec = {"type": "regex", "pattern": "(a+)+$", "mode": "search"}
    with BatchGrader(grader_config(spec), 1.0) as batch:
        assert batch.server is not None
        items = ["aaa", "a" * 40 + "!", "b", "xa"]
        graded = batch.grade(items, [{}] * 4)
        assert graded.rewards == [1.0, 0.0, 0.0, 1.0]
        assert graded.metrics == {"grader_errors": 0.0, "grader_timeouts": 0.25}
        first = batch.server.pid
        assert first is not None
        assert batch.grade(["aa"], [{}]).rewards == [1.0]
        assert batch.server.pid == first  # reused across batches
    assert batch.server.pid is None  # closed


def test_server_start_failure_is_a_grader_error_of_every_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # a child that exits at once
    with GradingServer(grader_config({"type": "regex", "pattern": "a"}), 5.0) as server:
        outcomes = server.grade([("a", {}), ("b", {})])
    assert [(o.value, o.failure) for o in outcomes] == [(0.0, "error"), (0.0, "error")]
    assert outcomes[0].message == "the grading server exited while starting (exit status 1)"


def test_a_server_that_cannot_be_started_at_all_names_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-python"
    monkeypatch.setattr(sys, "executable", str(missing))  # Popen raises: no child at all
    with GradingServer(grader_config({"type": "regex", "pattern": "a"}), 5.0) as server:
        outcomes = server.grade([("a", {}), ("b", {})])
    assert [(o.value, o.failure) for o in outcomes] == [(0.0, "error"), (0.0, "error")]
    assert outcomes[0].message == (
        f"cannot start the grading server: [Errno 2] No such file or directory: '{missing}'"
    )


def kill_the_child_after_its_check(server: GradingServer, times: int) -> None:
    """The child dies between `grade`'s check that it runs and the batch's write (it was
    alive when asked, gone when written to), `times` times."""
    ensure = server._ensure_started

    def then_kill() -> None:
        nonlocal times
        ensure()
        if times > 0:
            times -= 1
            proc = server._child.proc
            assert proc is not None
            proc.kill()
            proc.wait()

    server._ensure_started = then_kill  # type: ignore[method-assign]


def test_a_child_gone_when_the_batch_is_written_is_replaced_once() -> None:
    spec = grader_config({"type": "regex", "pattern": "a"})
    with GradingServer(spec, 5.0) as server:
        assert [o.value for o in server.grade([("a", {})])] == [1.0]
        kill_the_child_after_its_check(server, 1)
        assert [(o.value, o.failure) for o in server.grade([("a", {}), ("b", {})])] == [
            (1.0, None),
            (0.0, None),
        ]
        assert server.starts == 2
        kill_the_child_after_its_check(server, 2)  # and the new one too: no third try
        outcomes = server.grade([("a", {})])
    assert [(o.value, o.failure, o.message) for o in outcomes] == [
        (0.0, "error", "the grading server takes no input")
    ]
    assert server.starts == 3  # the running child, then one new one


PARENT = """
import sys, types
core = types.ModuleType("core"); core.__path__ = ["core"]; sys.modules["core"] = core  # no torch
from pydantic import TypeAdapter, ValidationError
from core.graders import GradingServer
from core.config.graders import GraderConfig
cfg = TypeAdapter(GraderConfig).validate_python({"type": "regex", "pattern": "(a+)+$"})
server = GradingServer(cfg, 600.0)
server.grade([("a", {})])
print(server.pid, flush=True)
server.grade([("a" * 60 + "!", {})])  # hangs for ever
"""


def test_the_server_dies_with_its_parent_even_while_grading() -> None:
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=root, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the child is now deep inside the regex
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_records_shared_by_a_group_are_sent_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[bytes] = []
    server = GradingServer(grader_config({"type": "regex", "field": "answer"}), 5.0)
    with server:
        write = server._child.write

        def spy(data: bytes, deadline: float) -> bool:
            sent.append(data)
            return write(data, deadline)

        monkeypatch.setattr(server._child, "write", spy)
        record = {"prompt": "p", "answer": "a+"}
        outcomes = server.grade([("aa", record), ("b", record), ("a", {"answer": "b"})])
    assert [o.value for o in outcomes] == [1.0, 0.0, 0.0]
    batch = json.loads(sent[-1])
    assert batch == {
        "records": [{"prompt": "p", "answer": "a+"}, {"answer": "b"}],
        "items": [[0, "aa"], [0, "b"], [1, "a"]],
    }


def test_graders_package_imports_nothing_heavy() -> None:
    code = textwrap.dedent(
        """
        import sys, types
        core = types.ModuleType("core"); core.__path__ = ["core"]; sys.modules["core"] = core
        import core.graders
        heavy = {"torch", "math_verify", "sympy", "jsonschema"} & set(sys.modules)
        print(sorted(heavy))
        """
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.usefixtures("plugins")
def test_a_grader_that_hangs_on_every_completion_costs_a_step_the_batch_limit() -> None:
    cfg = grader_config({"type": "plugin", "name": "sleep"})
    with BatchGrader(cfg, 1.0, batch_timeout_seconds=2.5) as batch:
        t0 = time.monotonic()
        graded = batch.grade(["hang"] * 50, [{}] * 50)
        elapsed = time.monotonic() - t0
    # without the batch limit: 50 timeouts of 1 s (and 50 restarts)
    assert 2.5 <= elapsed < 8.0
    assert graded.rewards == [0.0] * 50
    assert graded.metrics == {"grader_errors": 0.0, "grader_timeouts": 1.0}
