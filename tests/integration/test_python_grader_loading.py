"""A python grader that cannot load, on the real stack (redis-server, `pdppo serve`, a worker),
driven by the official `openai` package: a top level that raises or never finishes fails its job
before training (`invalid_input`, naming the grader and the exception's last line) instead of
scoring 0 on every step, and is a 400 from graders.run within PDPPO_OPENAI_PYTHON_LOAD_SECONDS
instead of a 200 after the grading server's 60 s start-up deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.integration.openai_sdk import ONE_STEP, create, sdk, step_metrics, wait
from tests.support.stack import Service
from tests.support.waits import TERMINAL

GRADE = "def grade(sample, item):\n    return 1.0\n"
RAISES = "x = 1\n1 / 0\n" + GRADE
HANGS = "while True:\n    pass\n" + GRADE


def python(source: str, name: str = "p") -> dict[str, Any]:
    return {"type": "python", "name": name, "source": source}


def message(error: openai.APIStatusError) -> str:
    """The error object's message, as the API wrote it (the SDK's adds the status)."""
    body = error.body
    assert isinstance(body, dict), body
    return str(body["message"])


def test_graders_run_answers_400_at_once_for_a_top_level_that_raises_or_hangs(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(PDPPO_OPENAI_PYTHON_GRADERS="true", PDPPO_OPENAI_PYTHON_LOAD_SECONDS="1")
    service.start_api()
    with sdk(service) as client:
        graders = client.fine_tuning.alpha.graders
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError) as caught:
            graders.run(grader=python(RAISES), model_sample="7")
        assert time.monotonic() - started < 20
        assert caught.value.param == "grader.source"
        assert message(caught.value) == (
            "grader: python grader 'p' raised while loading at line 2: "
            "ZeroDivisionError: division by zero"
        )
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError) as caught:
            graders.run(grader=python(HANGS), model_sample="7")
        took = time.monotonic() - started
        assert 1.0 <= took < 20, took  # before: a 200 after the 60 s start-up deadline
        assert message(caught.value) == (
            "grader: python grader 'p' did not finish loading in 1 s "
            "(PDPPO_OPENAI_PYTHON_LOAD_SECONDS)"
        )
        multi = {
            "type": "multi",
            "name": "m",
            "graders": {"a": python(GRADE, "a"), "b": python(RAISES, "b")},
            "calculate_output": "a",
        }
        with pytest.raises(openai.BadRequestError) as caught:
            graders.run(grader=multi, model_sample="7")
        assert caught.value.param == "grader.graders.b.source"
        # the validate route still only parses: it never runs the code
        assert graders.validate(grader=python(HANGS)).grader is not None
        assert graders.run(grader=python(GRADE), model_sample="7").reward == 1.0


def test_a_job_whose_python_grader_cannot_load_fails_before_training(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(PDPPO_OPENAI_PYTHON_GRADERS="true", PDPPO_OPENAI_PYTHON_LOAD_SECONDS="1")
    service.start_api()
    service.start_worker("cpu")
    with sdk(service) as client:
        raising = create(client, python(RAISES), ONE_STEP)
        hanging = create(client, python(HANGS), ONE_STEP)
        for job, says in (
            (raising, "raised while loading at line 2: ZeroDivisionError: division by zero"),
            (hanging, "did not finish loading in 1 s (PDPPO_OPENAI_PYTHON_LOAD_SECONDS)"),
        ):
            done = wait(client, job.id, TERMINAL)
            assert done.status == "failed" and done.error is not None, done
            assert done.error.code == "invalid_input"
            assert done.error.message == f"train.task.grader.grader: python grader 'p' {says}"
            assert step_metrics(client, job.id) == []  # before: one step, every reward 0
