"""OpenAI's `python` and `score_model` graders (`core.graders.hosted`): refused unless the operator
allows them, a tenant's code run only in the grading server (and cut by its deadline), a score
model asked over real HTTP (a local chat-completions server), its reply read and mapped onto
[0, 1]; known values throughout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from core.config.graders import GraderConfig
from core.graders import BatchGrader, GraderOptions, ModelEndpoint, build_grader
from core.graders.base import Grader
from core.graders.hosted import NoScore, normalise, parse_score, sample_of
from pdppo.settings import Settings
from tests.core.chat_server import Endpoint

ADAPTER: TypeAdapter[Any] = TypeAdapter(GraderConfig)
OUT = "{{sample.output_text}}"
DIGIT = "def grade(sample, item):\n    return 1.0 if sample['output_text'][:1].isdigit() else 0\n"
PYTHON_ON = GraderOptions(python=True)


def config(grader: dict[str, Any]) -> GraderConfig:
    return ADAPTER.validate_python({"type": "openai", "grader": grader})  # type: ignore[no-any-return]


def python(source: str, **extra: Any) -> dict[str, Any]:
    return {"type": "python", "name": "p", "source": source, **extra}


def built(grader: dict[str, Any], options: GraderOptions, *, load: bool = True) -> Grader:
    return build_grader(config(grader), load_plugins=load, options=options)


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("7", 7.0),
        (" 7\n", 7.0),
        ("Score: 7/10", 7.0),
        ("I would say 8.5 out of 10.", 8.5),
        (".5", 0.5),
        ("-2", -2.0),
        ("1e1", 10.0),
        ('{"steps": [{"description": "ok", "conclusion": "3 is right"}], "result": 6}', 6.0),
        ('{"score": 0.25}', 0.25),
        ("4.0", 4.0),
    ],
)
def test_the_score_in_a_models_reply(reply: str, score: float) -> None:
    assert parse_score(reply) == score


@pytest.mark.parametrize("reply", ["", "no idea", "1e999", '{"result": "high"}'])
def test_a_reply_without_a_finite_number_is_no_score(reply: str) -> None:
    with pytest.raises(NoScore):
        parse_score(reply)


def test_no_score_quotes_the_replys_first_200_characters() -> None:
    with pytest.raises(NoScore) as caught:
        parse_score("x" * 1000)
    assert str(caught.value) == f"the score model's reply holds no number: {'x' * 200!r}"


@pytest.mark.parametrize(
    ("value", "low", "high", "unit"),
    [(7, 0, 10, 0.7), (0, 0, 10, 0.0), (10, 0, 10, 1.0), (12, 0, 10, 1.0), (-1, 0, 10, 0.0),
     (3, 1, 5, 0.5), (0, -1, 1, 0.5)],
)  # fmt: skip
def test_a_range_maps_onto_0_1(value: float, low: float, high: float, unit: float) -> None:
    assert normalise(value, low, high) == pytest.approx(unit)


def test_the_sample_a_python_grader_gets() -> None:
    assert sample_of("42") == {"output_text": "42", "output_json": 42, "output_tools": []}
    assert sample_of("{'a'") == {"output_text": "{'a'", "output_json": None, "output_tools": []}


def test_python_and_score_model_are_refused_naming_the_setting_unless_allowed() -> None:
    grader = python(DIGIT)
    with pytest.raises(ValueError, match="PDPPO_OPENAI_PYTHON_GRADERS=true") as caught:
        built(grader, GraderOptions())
    assert str(caught.value).startswith("task.grader.grader: python graders are off")
    assert built(grader, PYTHON_ON).score("7 apples", {}) == 1.0
    judge = {
        "type": "score_model",
        "name": "j",
        "model": "m",
        "input": [{"role": "user", "content": OUT}],
    }
    with pytest.raises(ValueError, match=r"not configured \(PDPPO_SCORE_MODEL_ENDPOINT\)"):
        built(judge, PYTHON_ON)  # python allowed says nothing about a score model


@pytest.mark.parametrize(
    ("completion", "score"), [("7 apples", 1.0), ("seven", 0.0), ("", 0.0), ("0", 1.0)]
)
def test_a_python_grader_scores_as_its_code_says(completion: str, score: float) -> None:
    assert built(python(DIGIT), PYTHON_ON).score(completion, {"answer": "x"}) == score


def test_a_python_graders_number_is_clipped_and_what_is_no_number_is_an_error() -> None:
    def returning(expr: str, **extra: Any) -> Grader:
        return built(python(f"def grade(sample, item):\n    return {expr}\n", **extra), PYTHON_ON)

    assert returning("item['n'] / 10").score("", {"n": 3}) == pytest.approx(0.3)
    assert returning("7").score("", {}) == 1.0
    assert returning("-1").score("", {}) == 0.0
    assert returning("True").score("", {}) == 1.0
    assert returning("0.6", pass_threshold=0.5).score("", {}) == 1.0
    assert returning("0.4", pass_threshold=0.5).score("", {}) == 0.0
    with pytest.raises(TypeError, match="returned str, not a number"):
        returning("'1'").score("", {})
    with pytest.raises(ValueError, match="returned nan, not a finite number"):
        returning("float('nan')").score("", {})


def test_a_python_grader_cannot_change_the_record_its_neighbours_read() -> None:
    source = "def grade(sample, item):\n    item['seen'].append(1)\n    return len(item['seen'])\n"
    grader = built(python(source), PYTHON_ON)
    record = {"seen": []}
    assert [grader.score("", record) for _ in range(3)] == [1.0, 1.0, 1.0]
    assert record == {"seen": []}


def test_outside_the_grading_server_a_python_graders_code_is_parsed_never_run(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').close()\n{DIGIT}"
    grader = built(python(source), PYTHON_ON, load=False)  # what the trainer's process does
    assert not marker.exists()
    with pytest.raises(RuntimeError, match="runs in the grading server only"):
        grader.score("1", {})
    built(python(source), PYTHON_ON, load=True)  # what the grading server does
    assert marker.exists()


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("def grade(sample, item)\n    return 1\n", "not python: expected ':' (line 1)"),
        ("x = 1\n", "defines no function grade(sample, item)"),
        ("grade = 1\n", "defines no function grade(sample, item)"),
        ("x = " + "-" * 99_000 + "1\n", "not python: nested too deeply to parse"),
        ("x = 1\0\ndef grade(s, i):\n    return 1\n", "not python: source code"),
    ],
)
def test_python_that_cannot_grade_is_refused_before_it_runs(source: str, says: str) -> None:
    """Refused by the config, alone or in a multi, so nothing builds it: the API's 422 at
    submission, never a job that fails on the worker (the parser's own failures on deep nesting
    included, which were a 500)."""
    multi = {"type": "multi", "name": "m", "graders": {"p": python(source)}}
    multi["calculate_output"] = "p"
    for grader, where in [
        (python(source), ("openai", "grader", "python", "source")),
        (multi, ("openai", "grader", "multi", "graders", "p", "python", "source")),
    ]:
        with pytest.raises(ValidationError) as caught:
            config(grader)
        errors = caught.value.errors()
        assert [e["loc"] for e in errors] == [where]
        assert errors[0]["msg"].startswith(f"Value error, {says}"), errors


def test_a_python_grader_runs_in_the_grading_server_and_a_loop_is_cut_by_its_deadline() -> None:
    loop = (
        "def grade(sample, item):\n"
        "    while sample['output_text'] == 'loop':\n"
        "        pass\n"
        "    return 1.0 if sample['output_text'][:1].isdigit() else 0.0\n"
    )
    with BatchGrader(config(python(loop)), 1.0, options=PYTHON_ON) as batch:
        assert batch.server is not None  # never in the trainer's process
        grades = batch.grade(["7", "loop", "x", "8"], [{}] * 4)
        assert batch.server.starts == 2  # killed at the loop, restarted for the rest
    assert grades.rewards == [1.0, 0.0, 0.0, 1.0]
    assert grades.metrics == {"grader_errors": 0.0, "grader_timeouts": 0.25}


def test_the_grading_server_keeps_the_services_settings_from_a_python_grader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PDPPO_API_KEYS", "alice:secret-key-of-alice")
    monkeypatch.setenv("PDPPO_REDIS_URL", "redis://:password@redis:6379/0")
    monkeypatch.setenv("GRADER_VISIBLE", "1")
    source = (
        "import os\n"
        "def grade(sample, item):\n"
        "    seen = [k for k in os.environ if k.startswith('PDPPO_')]\n"
        "    return 1.0 if os.environ.get('GRADER_VISIBLE') == '1' and not seen else 0.0\n"
    )
    with BatchGrader(config(python(source)), 5.0, options=PYTHON_ON) as batch:
        assert batch.grade(["x"], [{}]).rewards == [1.0]


def test_a_worker_without_the_option_refuses_the_grader_when_the_task_is_built() -> None:
    with pytest.raises(ValueError, match="python graders are off"):
        BatchGrader(config(python(DIGIT)), 1.0)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    yield served
    served.close()


JUDGE: dict[str, Any] = {
    "type": "score_model",
    "name": "judge",
    "model": "job:abc",
    "input": [
        {"role": "developer", "content": "Score the answer from 0 to 10."},
        {
            "role": "user",
            "type": "message",
            "content": [
                {"type": "input_text", "text": "Question: {{item.question}}"},
                {"type": "input_text", "text": "Answer: {{sample.output_text}}"},
            ],
        },
    ],
    "range": [0, 10],
    "sampling_params": {"temperature": 0.0, "seed": 3, "max_completions_tokens": 8},
}


def test_a_score_model_asks_the_endpoint_and_maps_its_range(endpoint: Endpoint) -> None:
    options = GraderOptions(score_model=ModelEndpoint(endpoint.url, "sk-judge", 5.0))
    grader = built(JUDGE, options)
    assert grader.score("Paris", {"question": "Capital of France?"}) == pytest.approx(0.7)
    headers, body = endpoint.requests[0]
    assert headers["authorization"] == "Bearer sk-judge"
    assert body == {
        "model": "job:abc",
        "messages": [
            {"role": "system", "content": "Score the answer from 0 to 10."},
            {"role": "user", "content": "Question: Capital of France?\n\nAnswer: Paris"},
        ],
        "temperature": 0.0,
        "seed": 3,
        "max_tokens": 8,
    }
    endpoint.reply = "Score: 12/10"
    assert grader.score("Paris", {"question": "q"}) == 1.0
    endpoint.status = 500
    with pytest.raises(RuntimeError) as caught:
        grader.score("Paris", {"question": "q"})
    assert str(caught.value) == 'the score model endpoint answered 500: {"error": "down"}'
    endpoint.error = "e" * 1000  # a long error page: its first 300 bytes
    with pytest.raises(RuntimeError) as caught:
        grader.score("Paris", {"question": "q"})
    assert str(caught.value) == f'the score model endpoint answered 500: {{"error": "{"e" * 289}'
    endpoint.status, endpoint.reply = 200, "7"
    passing = built({**JUDGE, "pass_threshold": 7}, options)  # in the range's units
    assert passing.score("a", {"question": "q"}) == 1.0
    endpoint.reply = "6.9"
    assert passing.score("a", {"question": "q"}) == 0.0
    with pytest.raises(ValueError, match="the record has no 'question'"):
        grader.check({"answer": "x"})


def test_a_score_model_in_the_grading_server_counts_what_fails(endpoint: Endpoint) -> None:
    options = GraderOptions(score_model=ModelEndpoint(endpoint.url, "", 5.0))
    records = [{"question": "q"}] * 2
    with BatchGrader(config(JUDGE), 5.0, options=options) as batch:
        assert batch.server is not None
        assert batch.grade(["a", "b"], records).rewards == pytest.approx([0.7, 0.7])
        assert "authorization" not in endpoint.requests[0][0]
        endpoint.reply = "no idea"
        assert batch.grade(["a"], records[:1]).metrics["grader_errors"] == 1.0
        endpoint.status = 500
        assert batch.grade(["a"], records[:1]).metrics["grader_errors"] == 1.0
    unreachable = GraderOptions(score_model=ModelEndpoint("http://127.0.0.1:9/v1", "", 2.0))
    grader = built(JUDGE, unreachable)
    with pytest.raises(RuntimeError, match="the score model endpoint did not answer"):
        grader.score("a", {"question": "q"})


def test_a_score_model_range_must_be_ordered_and_its_input_text() -> None:
    with pytest.raises(ValidationError, match=r"range \[10, 0\] must be \[low, high\]"):
        config({**JUDGE, "range": [10, 0]})
    image = {"type": "input_image", "image_url": "http://x/y.png"}
    with pytest.raises(ValidationError):
        config({**JUDGE, "input": [{"role": "user", "content": [image]}]})


def test_the_options_cross_to_the_grading_server_and_keep_the_key_out_of_repr() -> None:
    options = GraderOptions(True, ModelEndpoint("http://h/v1", "sk-secret", 9.0))
    assert GraderOptions.from_json(json.loads(json.dumps(options.to_json()))) == options
    assert GraderOptions.from_json(None) == GraderOptions()
    assert "sk-secret" not in repr(options)


def test_the_operators_settings_become_the_grader_options(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().grader_options() == GraderOptions()
    monkeypatch.setenv("PDPPO_OPENAI_PYTHON_GRADERS", "true")
    monkeypatch.setenv("PDPPO_SCORE_MODEL_ENDPOINT", "http://judge:8000/v1")
    monkeypatch.setenv("PDPPO_SCORE_MODEL_API_KEY", "sk-1")
    monkeypatch.setenv("PDPPO_SCORE_MODEL_TIMEOUT_SECONDS", "12")
    assert Settings().grader_options() == GraderOptions(
        True, ModelEndpoint("http://judge:8000/v1", "sk-1", 12.0)
    )
    monkeypatch.setenv("PDPPO_SCORE_MODEL_ENDPOINT", "judge:8000")
    with pytest.raises(ValidationError, match="must be an http"):
        Settings()
