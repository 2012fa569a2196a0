"""Unknown names told with the close ones (`core.config.names`): the section a spec key is in,
found by walking pydantic's error location through sections, tagged unions, mappings, lists and
optional sections; a location that leaves the models gets the plain message, never an error."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.config import LoraConfig, OptimConfig, TinyModelConfig
from core.config.graders import JsonSchemaGrader, RegexGrader
from core.config.names import did_you_mean, explained, model_at, unknown_field
from core.config.openai_graders import OpenAISamplingParams, OpenAITextPart
from core.training.steering import STEERABLE
from pdppo.spec import JobSpec, Resources


def test_did_you_mean_the_closest_name_or_nothing() -> None:
    assert did_you_mean("optim.lrr", STEERABLE) == "; did you mean optim.lr?"
    assert did_you_mean("stepz", ["steps", "seed"]) == "; did you mean steps?"
    assert did_you_mean("zzz", ["steps", "seed"]) == ""


G = ("train", "task", "grader")


@pytest.mark.parametrize(
    ("loc", "model"),
    [
        (("train", "optim"), OptimConfig),
        (("resources",), Resources),
        (("train", "model", "tiny"), TinyModelConfig),
        (("train", "model", "lora"), LoraConfig),  # `LoraConfig | None`
        ((*G, "json_schema"), JsonSchemaGrader),  # a discriminated union's tag
        ((*G, "multi", "graders", "a", "regex"), RegexGrader),  # a mapping's key, then a tag
        ((*G, "openai", "grader", "score_model", "sampling_params"), OpenAISamplingParams),
        # a list's index, then a callable discriminator's Tag
        (
            (*G, "openai", "grader", "score_model", "input", 0, "content", "parts", 0),
            OpenAITextPart,
        ),
        ((), JobSpec),
    ],
)
def test_the_model_at_a_location(loc: tuple[str | int, ...], model: type) -> None:
    assert model_at(JobSpec, loc) is model


@pytest.mark.parametrize(
    "loc",
    [
        ("train", "steps"),  # a number, not a section
        ("train", "nope"),
        (*G, "no_such_kind"),
        (*G, "openai", "grader", "score_model", "input", "x"),  # a list's part is an index
        ("train", "report_to", 0),
    ],
)
def test_a_location_outside_the_models_gets_the_plain_message(loc: tuple[str | int, ...]) -> None:
    assert model_at(JobSpec, loc) is None
    assert unknown_field(JobSpec, (*loc, "k")) == "unknown field"


def test_every_unknown_key_of_a_spec_is_told_and_the_other_errors_kept() -> None:
    bad: dict[str, Any] = {
        "trian": {},
        "resources": {"gpu": 1},
        "train": {"steps": 0, "optim": {"learning_rate": 1}},
    }
    with pytest.raises(ValidationError) as refused:
        JobSpec.model_validate(bad | {"train": bad["train"]})
    told = {
        ".".join(map(str, e["loc"])): e["msg"] for e in explained(refused.value.errors(), JobSpec)
    }
    assert told == {
        "trian": "unknown field trian; did you mean train?",
        "resources.gpu": "unknown field gpu; did you mean gpus?",
        "train.steps": "Input should be greater than or equal to 1",
        "train.optim.learning_rate": (
            "unknown field learning_rate (this section takes: lr, weight_decay, beta1, beta2, "
            "eps, max_grad_norm, schedule, lr_warmup_steps, min_lr_ratio, grad_accumulation)"
        ),
    }
