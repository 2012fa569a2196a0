"""The OpenAI surface's translations, one function at a time: a create request to the job spec
it runs (each hyperparameter's mapping, the pdppo extension winning), a stream entry to an
OpenAI event, a native error body to OpenAI's error object, and the schema those routes publish.
The SDK against the real stack is tests/integration/test_openai_sdk.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.openai.errors import _translated
from api.openai.schemas import FineTuningJobCreate
from api.openai.translate import Refused, to_event, to_spec
from tests.support.inprocess import KEYS, call
from tests.support.openai_inprocess import GRADER

FILE = "file-" + "a" * 32


def create(**changes: Any) -> FineTuningJobCreate:
    body: dict[str, Any] = {
        "model": "builtin:tiny",
        "training_file": FILE,
        "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}},
    }
    hyperparameters = changes.pop("hp", None)
    if hyperparameters is not None:
        body["method"]["reinforcement"]["hyperparameters"] = hyperparameters
    body.update(changes)
    return FineTuningJobCreate.model_validate(body)


def test_defaults_train_one_epoch_at_pdppos_batch_and_rate() -> None:
    spec, resolved = to_spec(create(), training_records=100)
    train = spec.train
    # 100 records, 16 prompts a step (pdppo's default): ceil(100 / 16) = 7 steps for one epoch
    assert (train.rollout.prompts_per_step, train.steps) == (16, 7)
    assert (train.rollout.group_size, train.eval_every, train.seed) == (8, 0, 0)
    assert train.task.name == "jsonl" and train.task.file == FILE
    assert train.task.grader is not None and train.task.grader.type == "openai"
    assert resolved == {"batch_size": 16, "n_epochs": 1, "learning_rate_multiplier": 1.0}
    assert spec.name is None


def test_each_hyperparameter_maps_onto_its_spec_field() -> None:
    hp = {
        "batch_size": 8,
        "n_epochs": 3,
        "learning_rate_multiplier": 0.25,
        "compute_multiplier": 1.5,
        "eval_interval": 5,
        "eval_samples": 4,
        "reasoning_effort": "low",
    }
    base, _ = to_spec(create(), training_records=20)
    spec, resolved = to_spec(
        create(hp=hp, seed=11, suffix="mine", validation_file="file-" + "b" * 32),
        training_records=20,
    )
    train = spec.train
    assert train.rollout.prompts_per_step == 8
    assert train.steps == 8  # ceil(3 * 20 / 8)
    assert train.rollout.group_size == 12  # round(8 * 1.5)
    assert (train.eval_every, train.eval_samples) == (5, 4)
    assert train.optim.lr == pytest.approx(base.train.optim.lr * 0.25)  # type: ignore[operator]
    assert (train.seed, spec.name, train.task.validation_file) == (11, "mine", "file-" + "b" * 32)
    assert resolved == {"batch_size": 8, "n_epochs": 3, "learning_rate_multiplier": 0.25}


@pytest.mark.parametrize(("multiplier", "group"), [(0.01, 2), (0.3, 2), (0.4, 3), (2, 16)])
def test_compute_multiplier_scales_the_group_never_below_two(multiplier: float, group: int) -> None:
    spec, _ = to_spec(create(hp={"compute_multiplier": multiplier}), training_records=16)
    assert spec.train.rollout.group_size == group


def test_auto_values_are_pdppos_defaults_and_a_validation_file_is_evaluated_at_the_end() -> None:
    auto = dict.fromkeys(
        ["batch_size", "n_epochs", "learning_rate_multiplier", "eval_interval", "eval_samples"],
        "auto",
    )
    spec, resolved = to_spec(
        create(hp=auto, validation_file="file-" + "b" * 32), training_records=32
    )
    assert (spec.train.rollout.prompts_per_step, spec.train.steps) == (16, 2)
    assert spec.train.eval_every == 2  # the last step
    assert resolved["learning_rate_multiplier"] == 1.0


def test_the_pdppo_extension_wins_over_the_translation() -> None:
    extension = {
        "train": {
            "steps": 3,
            "optim": {"lr": 0.01},
            "rollout": {"prompts_per_step": 2},
            "algorithm": {"mask": "dppo"},
        },
        "resources": {"device": "cpu"},
    }
    spec, resolved = to_spec(
        create(hp={"batch_size": 8, "learning_rate_multiplier": 0.5}, pdppo=extension),
        training_records=100,
    )
    assert (spec.train.steps, spec.train.optim.lr) == (3, 0.01)
    assert spec.train.rollout.prompts_per_step == 2 and spec.train.algorithm.mask == "dppo"
    assert resolved["batch_size"] == 2
    # without its own steps, the epochs count the extension's batch: ceil(100 / 2)
    spec, _ = to_spec(create(pdppo={"train": {"rollout": {"prompts_per_step": 2}}}), 100)
    assert spec.train.steps == 50


@pytest.mark.parametrize(
    ("changes", "param", "says"),
    [
        ({"method": None}, "method", "not supervised (the default)"),
        ({"method": {"type": "dpo", "dpo": {}}}, "method.type", "not dpo"),
        ({"hyperparameters": {"n_epochs": 2}}, "hyperparameters", "for supervised jobs"),
        ({"integrations": [{"type": "wandb"}]}, "integrations", "not supported"),
        ({"pdppo": {"train": {"steps": 0}}}, "pdppo.train.steps", "greater than or equal to 1"),
        ({"suffix": "x\n"}, "suffix", "control characters"),
        ({"model": "nope"}, "model", "model.name='nope' must be 'builtin:tiny', 'hf:<path"),
        (
            {"pdppo": {"train": {"model": {"tiny": {"d_model": 0}}}}},
            "pdppo.train.model.tiny.d_model",
            "",
        ),
    ],
)
def test_requests_pdppo_cannot_run_are_refused_naming_the_field(
    changes: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(Refused) as caught:
        to_spec(create(**changes), training_records=10)
    assert caught.value.param == param
    assert says in str(caught.value)


def test_stream_entries_become_openai_events() -> None:
    metrics = to_event(
        "1700000000123-4",
        {"type": "metrics", "data": json.dumps({"step": 3, "total": 8, "metrics": {"loss": 0.5}})},
    )
    assert metrics.model_dump() == {
        "id": "ftevent-1700000000123-4",
        "object": "fine_tuning.job.event",
        "created_at": 1700000000,
        "level": "info",
        "message": "step 3/8",
        "type": "metrics",
        "data": {"pdppo_type": "metrics", "step": 3, "total_steps": 8, "loss": 0.5},
    }
    evaluation = to_event("5-0", {"type": "eval", "data": '{"step": 8, "total": 8, "metrics": {}}'})
    assert (evaluation.type, evaluation.message, evaluation.data) == (
        "metrics",
        "evaluation 8/8",
        {"pdppo_type": "eval", "step": 8, "total_steps": 8, "eval": True},
    )
    said = {
        kind: (
            to_event("1-0", {"type": kind, "data": data}).message,
            to_event("1-0", {"type": kind, "data": data}).level,
        )
        for kind, data in [
            ("status", '{"status": "failed"}'),
            ("done", '{"status": "succeeded"}'),
            ("checkpoint", '{"step": 4, "name": "step-000004"}'),
            ("log", '{"message": "slow grader", "level": "warning"}'),
            ("samples", '{"step": 2, "samples": [{}, {}]}'),
            ("config", '{"step": 3, "version": 1, "changes": {"optim.lr": 0.1}}'),
            ("phase", '{"name": "evaluating"}'),
        ]
    }
    assert said == {
        "status": ("Job failed", "error"),
        "done": ("The job has ended: succeeded", "info"),
        "checkpoint": ("Checkpoint step-000004 written at step 4", "info"),
        "log": ("slow grader", "warn"),
        "samples": ("2 samples of step 2", "info"),
        "config": ("Settings changed from step 4: {'optim.lr': 0.1}", "info"),
        "phase": ("Phase: evaluating", "info"),
    }


@pytest.mark.parametrize(
    ("status", "native", "expected_status", "expected"),
    [
        (
            404,
            {"detail": "job 'x' not found"},
            404,
            {
                "message": "job 'x' not found",
                "type": "invalid_request_error",
                "param": None,
                "code": "not_found",
            },
        ),
        (
            422,
            {
                "detail": "limit: too big",
                "errors": [{"loc": ["query", "limit"], "msg": "m", "type": "t"}],
            },
            400,
            {
                "message": "limit: too big",
                "type": "invalid_request_error",
                "param": "limit",
                "code": None,
            },
        ),
        (
            422,
            {
                "detail": "a: b",
                "errors": [{"loc": ["body", "method", "type"], "msg": "m", "type": "t"}],
            },
            400,
            {
                "message": "a: b",
                "type": "invalid_request_error",
                "param": "method.type",
                "code": None,
            },
        ),
        (
            401,
            {"detail": "missing or invalid API key"},
            401,
            {
                "message": "missing or invalid API key",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            },
        ),
        (
            429,
            {"detail": "too many"},
            429,
            {
                "message": "too many",
                "type": "rate_limit_error",
                "param": None,
                "code": "rate_limit_exceeded",
            },
        ),
        (
            503,
            {"detail": "the job store is unavailable", "job_id": "j"},
            503,
            {
                "message": "the job store is unavailable",
                "type": "server_error",
                "param": None,
                "code": None,
            },
        ),
    ],
)
def test_native_error_bodies_become_openais_error_object(
    status: int, native: dict[str, Any], expected_status: int, expected: dict[str, Any]
) -> None:
    got_status, body = _translated(status, json.dumps(native).encode())
    assert (got_status, json.loads(body)) == (expected_status, {"error": expected})
    already = json.dumps({"error": expected}).encode()
    assert _translated(400, already) == (400, already)
    assert _translated(500, already) == (500, already)


def test_an_error_body_that_is_not_json_becomes_the_message() -> None:
    status, body = _translated(502, b"Bad Gateway")
    assert (status, json.loads(body)["error"]) == (
        502,
        {"message": "Bad Gateway", "type": "server_error", "param": None, "code": None},
    )


def test_the_openai_routes_publish_openais_errors_and_no_422(settings: Any) -> None:
    (schema,) = call(settings, ("alice", "/openapi.json", {}))
    paths = schema.json()["paths"]
    openai_paths = [p for p in paths if p.startswith("/v1/fine_tuning")]
    assert len(openai_paths) == 9
    for path in openai_paths:
        for operation in paths[path].values():
            errors = {s: r for s, r in operation["responses"].items() if int(s) >= 400}
            assert "422" not in errors and "400" in errors, (path, sorted(errors))
            refs = {r["content"]["application/json"]["schema"]["$ref"] for r in errors.values()}
            assert refs == {"#/components/schemas/OpenAIErrorBody"}, path
    created = paths["/v1/fine_tuning/jobs"]["post"]["responses"]
    assert created["400"]["description"].startswith("a request pdppo cannot run; `param` names")
    assert created["409"]["description"] == "Idempotency-Key reused with another request"
    validate = paths["/v1/fine_tuning/alpha/graders/validate"]["post"]["responses"]
    assert validate["400"]["description"].startswith("not a grader this service runs")
    native = paths["/v1/jobs"]["post"]["responses"]
    assert native["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ValidationErrorBody"
    )


SOURCE = "def grade(sample, item):\n    return 1\n"  # valid: only the setting refuses it


def test_a_native_spec_with_a_grader_no_worker_runs_is_refused_at_submission(
    settings: Any,
) -> None:
    spec = {
        "train": {
            "task": {
                "name": "jsonl",
                "file": FILE,
                "grader": {
                    "type": "openai",
                    "grader": {"type": "python", "name": "p", "source": SOURCE},
                },
            }
        }
    }
    (refused,) = call(settings, ("alice", "/v1/jobs", {"json": spec}))
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith(
        "train.task.grader.grader: python graders are off on this service"
    )
    assert KEYS["alice"]


RG_TASK = {"name": "reasoning_gym", "dataset": "spell_backward", "size": 40}


def _rg(**changes: Any) -> FineTuningJobCreate:
    body: dict[str, Any] = {
        "model": "builtin:tiny",
        "method": {"type": "reinforcement", "reinforcement": {}},
        "pdppo": {"train": {"task": RG_TASK}},
    }
    body.update(changes)
    return FineTuningJobCreate.model_validate(body)


def test_a_reasoning_gym_task_takes_no_file_nor_grader_and_counts_its_rows() -> None:
    spec, resolved = to_spec(_rg(), training_records=None)
    task = spec.train.task
    assert (task.name, task.dataset, task.size, task.file, task.grader) == (
        "reasoning_gym",
        "spell_backward",
        40,
        None,
        None,
    )
    assert spec.train.steps == 3  # ceil(40 / 16)
    assert spec.train.eval_every == 3  # its held-out rows, at the last step
    assert resolved == {"batch_size": 16, "n_epochs": 1, "learning_rate_multiplier": 1.0}
    no_held_out = _rg(pdppo={"train": {"task": {**RG_TASK, "validation_size": 0}}})
    assert to_spec(no_held_out, None)[0].train.eval_every == 0
    default_size = _rg(pdppo={"train": {"task": {**RG_TASK, "size": None}}})
    assert to_spec(default_size, None)[0].train.steps == 63  # ceil(1000 / 16)


@pytest.mark.parametrize(
    ("changes", "param"),
    [
        ({"training_file": FILE}, "training_file"),
        ({"validation_file": FILE}, "validation_file"),
        (
            {"method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}}},
            "method.reinforcement.grader",
        ),
    ],
)
def test_a_reasoning_gym_task_refuses_the_fields_it_has_no_use_for(
    changes: dict[str, Any], param: str
) -> None:
    with pytest.raises(Refused) as info:
        to_spec(_rg(**changes), training_records=10)
    assert info.value.param == param
    assert str(info.value) == (
        f"{param}: a reasoning_gym task (pdppo.train.task) generates its rows and scores them "
        "with the dataset's score_answer; leave it out"
    )


def test_a_jsonl_task_still_needs_its_file_and_grader() -> None:
    without_file = FineTuningJobCreate.model_validate(
        {
            "model": "builtin:tiny",
            "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}},
        }
    )
    with pytest.raises(Refused) as info:
        to_spec(without_file, training_records=None)
    assert info.value.param == "training_file"
    without_grader = create(method={"type": "reinforcement", "reinforcement": {}})
    with pytest.raises(Refused) as info:
        to_spec(without_grader, training_records=10)
    assert info.value.param == "method.reinforcement.grader"
    assert str(info.value) == (
        "method.reinforcement.grader: required, unless pdppo.train.task is a reasoning_gym task"
    )
