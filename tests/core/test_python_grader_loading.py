"""A python grader's top level runs once, when a grading server loads it: one that raises, ends
the process or never finishes is a `GraderLoadError` naming the grader, raised by the server's
`start()` within `python_load_seconds` (not its minute-long start-up deadline), so a worker can
fail the job before training. Real grading servers (child processes) throughout."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import TypeAdapter

from core.config.graders import GraderConfig
from core.graders import (
    BatchGrader,
    GraderLoadError,
    GraderOptions,
    GradingServer,
    build_grader,
    load_python_graders,
)
from core.graders.hosted import last_line

ADAPTER: TypeAdapter[Any] = TypeAdapter(GraderConfig)
GRADE = "def grade(sample, item):\n    return 1.0\n"
FAST = GraderOptions(python=True, python_load_seconds=1.0)
WHERE = "task.grader.grader"


def config(grader: dict[str, Any]) -> GraderConfig:
    return ADAPTER.validate_python({"type": "openai", "grader": grader})  # type: ignore[no-any-return]


def python(top: str, name: str = "p") -> dict[str, Any]:
    return {"type": "python", "name": name, "source": top + GRADE}


def start(grader: dict[str, Any], options: GraderOptions = FAST) -> tuple[str, str, float]:
    """(message, where) of the GraderLoadError that starting a server for `grader` raises, and
    the seconds it took."""
    started = time.monotonic()
    with (
        GradingServer(config(grader), 5.0, options=options) as server,
        pytest.raises(GraderLoadError) as caught,
    ):
        server.start()
    return str(caught.value), caught.value.where, time.monotonic() - started


@pytest.mark.parametrize(
    ("top", "says"),
    [
        ("x = 1\n1 / 0\n", "raised while loading at line 2: ZeroDivisionError: division by zero"),
        ("import sys\nsys.exit(3)\n", "raised while loading at line 2: SystemExit: 3"),
        (
            "import json\njson.loads('{')\n",
            "at line 2: json.decoder.JSONDecodeError: Expecting property name",
        ),
        ("raise ValueError('one\\ntwo')\n", "at line 1: ValueError: ... two"),
        ("import os\nos._exit(3)\n", "ended the grading server while loading (exit status 3)"),
    ],
)
def test_a_top_level_that_raises_or_exits_fails_the_start_naming_the_grader(
    top: str, says: str
) -> None:
    message, where, took = start(python(top))
    assert message.startswith(f"{WHERE}: python grader 'p' ")
    assert says in message
    assert where == WHERE
    assert took < 20  # a start and the error: the 60 s start-up deadline never comes into it


def test_a_top_level_that_never_finishes_is_cut_after_python_load_seconds() -> None:
    message, where, took = start(python("while True:\n    pass\n"))
    assert message == (
        f"{WHERE}: python grader 'p' did not finish loading in 1 s "
        "(PDPPO_OPENAI_PYTHON_LOAD_SECONDS)"
    )
    assert where == WHERE
    assert 1.0 <= took < 20  # before: the server's 60 s start-up deadline


def test_in_a_multi_the_grader_that_hangs_is_named_and_each_top_level_has_its_own_time() -> None:
    """Two top levels of 0.6 s each load under a 1 s bound: the bound is each one's, not the
    sum's. The third never finishes and is the one named."""
    nap = "import time\ntime.sleep(0.6)\n"
    multi = {
        "type": "multi",
        "name": "m",
        "graders": {
            "a": python(nap, "a"),
            "b": python(nap, "b"),
            "c": python("while True:\n    pass\n", "c"),
        },
        "calculate_output": "a",
    }
    message, where, _ = start(multi)
    assert message.startswith(f"{WHERE}.graders.c: python grader 'c' did not finish loading in 1 s")
    assert where == f"{WHERE}.graders.c"
    del multi["graders"]["c"]  # type: ignore[attr-defined]
    assert load_python_graders(config(multi), WHERE, FAST) is True


def test_a_slow_top_level_within_its_time_loads_and_grades() -> None:
    slow = python("import time\ntime.sleep(1.5)\n")
    options = GraderOptions(python=True, python_load_seconds=5.0)
    with GradingServer(config(slow), 5.0, options=options) as server:
        server.start()
        assert server.starts == 1
        assert server.grade([("x", {})])[0].value == 1.0
        assert server.starts == 1  # the child `start` left running graded


def test_a_graders_top_level_is_checked_only_when_it_holds_python() -> None:
    check = {"type": "string_check", "name": "s", "input": "a", "reference": "a", "operation": "eq"}
    assert load_python_graders(config(check), WHERE, FAST) is False
    assert load_python_graders(config(python("")), WHERE, FAST) is True
    with pytest.raises(GraderLoadError, match="ZeroDivisionError"):
        load_python_graders(config(python("1/0\n")), WHERE, FAST)


def test_in_a_batch_a_grader_that_cannot_load_scores_0_as_an_error_quickly() -> None:
    """What a step sees when the server cannot come back (a top level that fails only on some
    starts): every completion an error that says why, at the load bound, not the minute."""
    started = time.monotonic()
    with BatchGrader(config(python("while True:\n    pass\n")), 5.0, options=FAST) as batch:
        grades = batch.grade(["1", "2"], [{}, {}])
    assert grades.metrics["grader_errors"] == 1.0
    assert time.monotonic() - started < 20


def test_outside_a_grading_server_a_top_level_that_raises_is_a_load_error_too() -> None:
    with pytest.raises(GraderLoadError) as caught:
        build_grader(config(python("1/0\n")), load_plugins=True, options=FAST)
    assert str(caught.value) == (
        "task.grader.grader: python grader 'p' raised while loading at line 1: "
        "ZeroDivisionError: division by zero"
    )


def test_the_last_line_of_an_exception() -> None:
    assert last_line(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"
    assert last_line(KeyError("k")) == "KeyError: 'k'"
    assert last_line(RuntimeError()) == "RuntimeError"
    assert last_line(ValueError("x" * 900)) == "ValueError: " + "x" * 488
