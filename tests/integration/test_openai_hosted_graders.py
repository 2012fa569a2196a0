"""OpenAI's `python` and `score_model` graders on the real stack (redis-server, `pdppo serve`, a
worker), driven by the official `openai` package: refused (400, naming the setting) while the
operator has not turned them on; with PDPPO_OPENAI_PYTHON_GRADERS and PDPPO_SCORE_MODEL_ENDPOINT
(a real chat-completions server of the test) they score a job's completions with known values, a
python grader that never returns is cut by the deadline and the job still succeeds, and a worker
whose settings lack them fails the job naming the setting."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from core.graders.hosted import NoScore, normalise, parse_score
from tests.core.chat_server import Endpoint
from tests.integration.openai_sdk import MULTI as MULTI_DIGITS
from tests.integration.openai_sdk import (
    ONE_STEP,
    create,
    sdk,
    step_metrics,
    wait,
)
from tests.support.stack import KEYS, Service
from tests.support.waits import TERMINAL

OUT = "{{sample.output_text}}"
DIGIT = "def grade(sample, item):\n    return 1.0 if sample['output_text'][:1].isdigit() else 0\n"
KNOWN = "def grade(sample, item):\n    return len(item['answer']) / 10\n"  # answers: 3 digits
LOOP = "def grade(sample, item):\n    while True:\n        pass\n"
JUDGE: dict[str, Any] = {
    "type": "score_model",
    "name": "judge",
    "model": "judge-model",
    "input": [
        {"role": "system", "content": "Score from 0 to 10 how well the answer fits."},
        {"role": "user", "content": f"Prompt answer {{{{item.answer}}}}; reply {OUT}"},
    ],
    "range": [0, 10],
}


def python(source: str, name: str = "p") -> dict[str, Any]:
    return {"type": "python", "name": name, "source": source}


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    yield served
    served.close()


@pytest.fixture
def client(service: Service) -> Iterator[OpenAI]:
    with sdk(service) as c:
        yield c


def test_python_and_score_model_graders_are_400s_while_the_operator_has_them_off(
    client: OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        create(client, python(DIGIT))
    assert caught.value.param == "method.reinforcement.grader"
    assert "python graders are off on this service" in caught.value.message
    assert "PDPPO_OPENAI_PYTHON_GRADERS=true" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        create(client, JUDGE)
    assert "configured (PDPPO_SCORE_MODEL_ENDPOINT)" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.alpha.graders.run(grader=python(DIGIT), model_sample="7")
    assert "PDPPO_OPENAI_PYTHON_GRADERS=true" in caught.value.message


def test_with_the_settings_on_python_and_score_model_graders_score_a_job(
    make_service: Callable[..., Service], endpoint: Endpoint
) -> None:
    service = make_service(
        PDPPO_OPENAI_PYTHON_GRADERS="true", PDPPO_SCORE_MODEL_ENDPOINT=endpoint.url
    )
    service.start_api()
    service.start_worker("cpu")
    with sdk(service) as client:
        graders = client.fine_tuning.alpha.graders
        assert graders.run(grader=python(DIGIT), model_sample="7 apples").reward == 1.0
        assert graders.run(grader=python(DIGIT), model_sample="seven").reward == 0.0
        looped = graders.run(grader=python(LOOP), model_sample="7")
        errors = looped.metadata.errors
        assert looped.reward == 0.0 and errors.python_grader_runtime_error
        assert "longer than 5 s" in (errors.python_grader_runtime_error_details or "")
        with pytest.raises(openai.BadRequestError) as caught:
            graders.validate(grader=python("def grade(sample, item)\n    return 1\n"))
        # refused by the grader's schema (core.config.openai_graders.parse_source)
        assert "grader.python.source: not python: expected ':' (line 1)" in caught.value.message

        # a multi of two python graders: the reward is `known`'s, 3 / 10 on every completion
        multi = {
            "type": "multi",
            "name": "m",
            "graders": {"known": python(KNOWN, "known"), "digit": python(DIGIT, "digit")},
            "calculate_output": "known",
        }
        job = create(client, multi)
        done = wait(client, job.id, TERMINAL)
        assert done.status == "succeeded", done
        (metrics,) = step_metrics(client, job.id)
        assert metrics["reward_mean"] == pytest.approx(0.3)
        assert metrics["grader/known"] == pytest.approx(0.3)
        assert 0.0 <= metrics["grader/digit"] <= 1.0
        assert (metrics["grader_errors"], metrics["grader_timeouts"]) == (0.0, 0.0)

        # a grader that never returns: every completion cut at the deadline, the job goes on
        task = {"grader_timeout_seconds": 0.5, "grader_batch_timeout_seconds": 1.0}
        slow = {**ONE_STEP, "train": {**ONE_STEP["train"], "task": task}}
        job = create(client, python(LOOP), slow)
        done = wait(client, job.id, TERMINAL)
        assert done.status == "succeeded", done
        (metrics,) = step_metrics(client, job.id)
        assert (metrics["reward_mean"], metrics["grader_timeouts"]) == (0.0, 1.0)

        # the score model answers 7 on [0, 10]: 0.7 for every completion
        job = create(client, JUDGE)
        done = wait(client, job.id, TERMINAL)
        assert done.status == "succeeded", done
        (metrics,) = step_metrics(client, job.id)
        assert metrics["reward_mean"] == pytest.approx(0.7)
        assert metrics["grader_errors"] == 0.0
        asked = [body for _, body in endpoint.requests]
        assert len(asked) == 16  # 4 prompts of 4 completions
        assert {b["model"] for b in asked} == {"judge-model"}
        assert asked[0]["messages"][1]["content"].startswith("Prompt answer ")


def test_a_worker_without_the_setting_fails_the_job_naming_it(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(PDPPO_OPENAI_PYTHON_GRADERS="true")
    service.start_api()
    service.env["PDPPO_OPENAI_PYTHON_GRADERS"] = "false"  # the worker's operator forgot it
    service.start_worker("cpu")
    with sdk(service) as client:
        job = create(client, python(DIGIT))
        done = wait(client, job.id, TERMINAL)
    assert done.status == "failed" and done.error is not None
    assert done.error.code == "invalid_input"
    assert "PDPPO_OPENAI_PYTHON_GRADERS=true" in done.error.message
    assert "(this worker's settings)" in done.error.message


def test_a_pdppo_sample_worker_is_a_score_model_endpoint(
    make_service: Callable[..., Service],
) -> None:
    """pdppo's own /v1/chat/completions, answering with a tuned `job:<id>`, judges for another
    service: the score its graders.run gives is the one read from the same chat completion
    asked directly (seeded, so both get the same text). Of a few samples, one whose reply holds
    a number is judged (when written: ";7O\x0c " for all five, 7 of [0, 9]), and one whose reply
    holds none, when there is one, is a parse error."""
    judged = make_service()
    judged.start_api()
    judged.start_worker("cpu")
    judged.start_sample_worker()
    replies: dict[str, str] = {}
    with sdk(judged) as client:
        job = create(client, MULTI_DIGITS)
        assert wait(client, job.id, TERMINAL).status == "succeeded"
        model = f"job:{job.id.removeprefix('ftjob-')}"
        for sample in ("123=", "45=", "7=", "908=", "Rate"):
            direct = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": sample}],
                max_tokens=16,
                temperature=1.0,
                seed=5,
            )
            replies[sample] = direct.choices[0].message.content or ""
    judging = make_service(
        PDPPO_SCORE_MODEL_ENDPOINT=f"{judged.base_url}/v1",
        PDPPO_SCORE_MODEL_API_KEY=KEYS["alice"],
    )
    judging.start_api()
    judge = {
        "type": "score_model",
        "name": "judge",
        "model": model,
        "input": [{"role": "user", "content": OUT}],
        "range": [0, 9],
        "sampling_params": {"temperature": 1.0, "seed": 5, "max_completions_tokens": 16},
    }
    scored = [s for s, reply in replies.items() if _has_score(reply)]
    unscored = [s for s, reply in replies.items() if not _has_score(reply)]
    assert scored, replies  # a byte-level model's 160 bytes hold a digit or two
    with sdk(judging) as client:
        ran = client.fine_tuning.alpha.graders.run(grader=judge, model_sample=scored[0])
        errors = ran.metadata.errors
        assert not errors.model_grader_server_error, errors.model_grader_server_error_details
        assert ran.reward == pytest.approx(normalise(parse_score(replies[scored[0]]), 0, 9))
        if unscored:
            ran = client.fine_tuning.alpha.graders.run(grader=judge, model_sample=unscored[0])
            assert ran.reward == 0.0 and ran.metadata.errors.model_grader_parse_error


def _has_score(reply: str) -> bool:
    try:
        parse_score(reply)
    except NoScore:
        return False
    return True
