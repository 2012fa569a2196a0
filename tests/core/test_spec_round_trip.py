"""A spec dumped and read back is the same spec, on every path the service sends one down.

The API stores `model_dump_json()` and the worker reads it back; the worker hands the trainer
`train.model_dump_json()`; a steered run rebuilds its config from `model_dump(mode="json")`;
`pdppo train` re-reads the config in each process; the client posts a model as
`model_dump(mode="json")`; the OpenAI surface re-reads a grader dumped without its nulls; a
spec file is YAML. A field whose dumped name is not the one validation reads (the `json_schema`
grader's `schema`, issue 49) broke every one of these paths: each is checked here for every
grader kind, every task kind and whole specs, drawn from the models (`spec_strategies`).
"""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from core.config import TrainConfig
from core.config.graders import GraderConfig, JsonSchemaGrader
from core.config.openai_graders import OpenAIGraderConfig
from core.config.task import REASONING_GYM_FIELDS, TaskConfig
from core.training.steering import steered
from pdppo.client import spec_to_dict
from pdppo.client.specs import spec_yaml_dump, spec_yaml_load
from pdppo.spec import JobSpec, parse_spec
from tests.core.spec_strategies import for_model, for_type, task, valid

GRADERS: TypeAdapter[Any] = TypeAdapter(GraderConfig)
GRADER_KINDS = list(get_args(get_args(GraderConfig)[0]))
OPENAI_KINDS = list(get_args(get_args(OpenAIGraderConfig)[0]))
TASK_NAMES = list(get_args(TaskConfig.model_fields["name"].annotation))

QUICK = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)


def _yaml(data: Any) -> Any:
    """`data` as a spec file holds it, read back as the CLI reads one."""
    return spec_yaml_load(spec_yaml_dump(data))


def assert_round_trips(adapter: TypeAdapter[Any], model: BaseModel) -> None:
    """`model` through each dump and the matching read, and the dump of what came back."""
    dumped = model.model_dump(mode="json")
    by_json = adapter.validate_json(model.model_dump_json())
    by_python = adapter.validate_python(dumped)
    by_yaml = adapter.validate_python(_yaml(dumped))
    by_plain_json = adapter.validate_python(json.loads(json.dumps(dumped)))
    for back in (by_json, by_python, by_yaml, by_plain_json):
        assert back == model
        assert back.model_dump(mode="json") == dumped


@pytest.mark.parametrize("kind", GRADER_KINDS, ids=lambda k: k.__name__)
@QUICK
@given(data=st.data())
def test_every_grader_kind_round_trips(kind: type[BaseModel], data: st.DataObject) -> None:
    grader = valid(GRADERS, data.draw(for_model(kind)))
    assume(grader is not None)
    assert isinstance(grader, kind)
    assert_round_trips(GRADERS, grader)


@pytest.mark.parametrize("kind", OPENAI_KINDS, ids=lambda k: k.__name__)
@QUICK
@given(data=st.data())
def test_every_openai_grader_round_trips_and_through_the_openai_surface(
    kind: type[BaseModel], data: st.DataObject
) -> None:
    """The OpenAI create request dumps its grader without nulls into the spec it builds
    (`api.openai.translate.to_spec`): the spec's grader is the one asked for."""
    from api.openai.schemas import FineTuningJobCreate
    from api.openai.translate import to_spec

    raw = data.draw(for_model(kind))
    grader = valid(GRADERS, {"type": "openai", "grader": raw})
    assume(grader is not None)
    assert_round_trips(GRADERS, grader)
    body = FineTuningJobCreate.model_validate(
        {
            "model": "builtin:tiny",
            "training_file": "file-" + "a" * 32,
            "method": {"type": "reinforcement", "reinforcement": {"grader": raw}},
        }
    )
    spec, _ = to_spec(body, training_records=4)
    assert spec.train.task.grader == grader


@pytest.mark.parametrize("name", TASK_NAMES)
@QUICK
@given(data=st.data())
def test_every_task_kind_round_trips(name: str, data: st.DataObject) -> None:
    drawn = valid(TypeAdapter(TaskConfig), data.draw(task(name)))
    assume(drawn is not None)
    assert_round_trips(TypeAdapter(TaskConfig), drawn)


SPECS: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)


def assert_spec_round_trips(spec: JobSpec) -> None:
    """A whole spec on each of the service's paths (see the module docstring)."""
    assert_round_trips(SPECS, spec)
    # the worker's trainer config, `pdppo train`'s processes
    assert TrainConfig.model_validate_json(spec.train.model_dump_json()) == spec.train
    # a steered run rebuilds its config from the start config's dump
    assert steered(spec.train, {}) == spec.train
    # the client posts a model as JSON data; a spec file, parsed as `pdppo train` does
    assert JobSpec.model_validate(spec_to_dict(spec)) == spec
    assert parse_spec(_yaml(spec.model_dump(mode="json"))) == spec


@QUICK
@given(raw=for_model(JobSpec))
def test_drawn_job_specs_round_trip(raw: dict[str, Any]) -> None:
    spec = valid(SPECS, raw)
    assume(spec is not None)
    assert_spec_round_trips(spec)


@QUICK
@given(grader=for_type(GraderConfig))
def test_a_spec_with_every_field_set_round_trips_with_any_grader(grader: dict[str, Any]) -> None:
    full = FULL_SPEC | {"train": FULL_SPEC["train"] | {"task": FULL_TASK | {"grader": grader}}}
    spec = valid(SPECS, full)
    assume(spec is not None)
    assert_spec_round_trips(spec)


FULL_TASK: dict[str, Any] = {
    "name": "jsonl",
    "min_len": 3,
    "max_len": 5,
    "file": "file-" + "b" * 32,
    "validation_path": "/data/held-out.jsonl",
    "validation_fraction": 0.0,
    "grader": {"type": "json_schema", "schema": {"type": "object"}, "field": "shape"},
    "grader_timeout_seconds": 2.5,
    "grader_batch_timeout_seconds": 60.0,
    "match": "numeric",
    "numeric_tolerance": 0.01,
    "warmup_steps": 3,
    "warmup_target": "answer",
    "warmup_lr": 0.002,
    "warmup_batch_size": 8,
}
FULL_SPEC: dict[str, Any] = {
    "name": "every field",
    "resources": {"device": "gpu", "gpus": 2, "timeout_minutes": 30.0},
    "train": {
        "model": {
            "name": "hf:/models/small",
            "dtype": "bfloat16",
            "lora": {"r": 4, "alpha": 8.0, "dropout": 0.1, "target_modules": ["q_proj"]},
            "tiny": {
                "d_model": 48,
                "n_layers": 3,
                "n_heads": 4,
                "max_seq_len": 96,
                "vocab_size": 1024,
            },
        },
        "task": FULL_TASK,
        "rollout": {
            "prompts_per_step": 4,
            "group_size": 3,
            "max_new_tokens": 6,
            "temperature": 0.9,
            "top_p": 0.95,
            "dtype": "bfloat16",
            "staleness": 1,
            "engine": "hf",
            "vllm_memory": 0.5,
            # async refuses staleness and several GPUs: FULL_SPEC gives the default mode
            "mode": "sync",
            "max_off_policy_steps": 2,
        },
        "algorithm": {
            "mask": "dppo",
            "kind": "kl",
            "estimator": "topk_tail",
            "delta_low": 0.1,
            "delta_high": 0.2,
            "top_k": 5,
            "is_cap": 10.0,
            "correction": {"type": "geo_rs", "low": 0.99, "high": 1.02},
            "normalize_std": True,
            "minibatches": 2,
            "epochs": 2,
            "kl_beta": 0.01,
            "fused_loss": False,
            "loss_agg": "seq_mean",
        },
        "optim": {
            "lr": 0.0001,
            "weight_decay": 0.01,
            "beta1": 0.8,
            "beta2": 0.99,
            "eps": 1e-6,
            "max_grad_norm": 0.5,
            "schedule": "cosine",
            "lr_warmup_steps": 2,
            "min_lr_ratio": 0.1,
            "grad_accumulation": 2,
        },
        "steps": 9,
        "checkpoint_every": 3,
        "keep_checkpoints": 2,
        "save_merged": False,
        "seed": 7,
        "device": "cuda",
        "sharding": "replicate",
        "eval_every": 3,
        "eval_on_start": True,
        "eval_samples": 2,
        "eval_greedy": False,
        "eval_max_prompts": 16,
        "log_samples_every": 2,
        "log_samples_count": 3,
        "silent_steps": 0,
        "report_to": ["tensorboard"],
    },
}


REASONING_GYM_ONLY = {f"train.task.{name}" for name in (*REASONING_GYM_FIELDS, "system_prompt")}
EXCLUSIVE = {"train.task.path", "train.task.validation_file", "train.task.environment"}
EXCLUSIVE |= REASONING_GYM_ONLY
"""Fields FULL_SPEC leaves out because one it sets excludes them (task.file, validation_path;
its jsonl task, every field of a reasoning_gym task: those are FULL_REASONING_GYM's; the
environment task's section: FULL_ENVIRONMENT's)."""

FULL_ENVIRONMENT: dict[str, Any] = {
    "name": "environment",
    "environment": {
        "name": "calculator",
        "args": {"min_value": 2, "max_value": 20, "ops": "+*"},
        "max_turns": 3,
        "max_tokens": 80,
        "step_timeout_seconds": 2.5,
    },
}
"""A task that sets every field of `task.environment`."""

FULL_REASONING_GYM: list[dict[str, Any]] = [
    {
        "name": "reasoning_gym",
        "dataset": "basic_arithmetic",
        "config": {"min_terms": 2, "max_terms": 3, "allow_parentheses": False},
        "size": 50,
        "seed": 3,
        "validation_size": 10,
        "system_prompt": "Answer inside <answer></answer>.",
    },
    {
        "name": "reasoning_gym",
        "datasets": [
            {"name": "basic_arithmetic", "weight": 2.5, "config": {"min_terms": 2}},
            {"name": "spell_backward", "weight": 1.0, "config": {}},
        ],
    },
]
"""Tasks that set every field only a reasoning_gym task takes, between them (`dataset` and
`datasets` exclude each other)."""


FULL_CORRECTIONS: list[dict[str, Any]] = [
    {"type": "none"},
    {"type": "tis", "level": "sequence", "cap": 3.0},
    {"type": "mis", "level": "sequence", "cap": 1.5},
    {"type": "icepop", "low": 0.4, "high": 3.0},
    {"type": "geo_rs", "low": 0.99, "high": 1.02},
    {"type": "cispo", "eps_low": 0.5, "eps_high": 0.3},
]
"""Every correction type with every field it takes (FULL_SPEC holds one of them)."""


def _unset(model: BaseModel, where: str = "") -> list[str]:
    """Fields of `model` (and its sections) the spec did not give."""
    out = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if name not in model.model_fields_set:
            out.append(f"{where}{name}")
        elif isinstance(value, BaseModel):
            out += _unset(value, f"{where}{name}.")
    return out


def test_the_full_spec_sets_every_field_and_round_trips() -> None:
    """FULL_SPEC gives every field (a field added later must be given there too),
    and its json_schema grader comes back with its schema."""
    spec = JobSpec.model_validate(FULL_SPEC)
    assert set(_unset(spec)) == EXCLUSIVE
    assert_spec_round_trips(spec)
    grader = spec.train.task.grader
    assert isinstance(grader, JsonSchemaGrader) and grader.json_schema == {"type": "object"}

    given: set[str] = set()
    for task_data in FULL_REASONING_GYM:
        rg = JobSpec.model_validate(FULL_SPEC | {"train": FULL_SPEC["train"] | {"task": task_data}})
        assert_spec_round_trips(rg)
        given |= {f"train.task.{name}" for name in rg.train.task.model_fields_set}
    assert given >= REASONING_GYM_ONLY, REASONING_GYM_ONLY - given

    env = JobSpec.model_validate(
        # no held-out episodes yet: an environment task takes no eval_every
        FULL_SPEC | {"train": FULL_SPEC["train"] | {"task": FULL_ENVIRONMENT, "eval_every": 0}}
    )
    assert env.train.task.environment is not None
    assert _unset(env.train.task.environment) == []
    assert_spec_round_trips(env)

    for correction in FULL_CORRECTIONS:  # the types that set their own weight take no is_cap
        algorithm = FULL_SPEC["train"]["algorithm"] | {"correction": correction, "is_cap": 1e4}
        spec = JobSpec.model_validate(
            FULL_SPEC | {"train": FULL_SPEC["train"] | {"algorithm": algorithm}}
        )
        assert _unset(spec.train.algorithm.correction) == []
        assert spec.train.algorithm.correction.model_dump() == correction
        assert_spec_round_trips(spec)


def test_a_spec_stored_with_the_old_field_name_still_loads() -> None:
    """Jobs stored and checkpoints written before the fix hold `json_schema`: they load, and
    are dumped again under `schema`."""
    stored = {
        "train": {
            "task": {
                "name": "jsonl",
                "path": "/data/d.jsonl",
                "grader": {"type": "json_schema", "json_schema": {"type": "object"}},
            }
        }
    }
    spec = JobSpec.model_validate_json(json.dumps(stored))
    grader = spec.train.task.grader
    assert isinstance(grader, JsonSchemaGrader) and grader.json_schema == {"type": "object"}
    assert spec.model_dump(mode="json")["train"]["task"]["grader"] == {
        "type": "json_schema",
        "schema": {"type": "object"},
        "field": "schema",
    }
    with pytest.raises(ValueError, match=r"give the schema as `schema` only \(json_schema is"):
        GRADERS.validate_python({"type": "json_schema", "schema": {}, "json_schema": {}})


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("{since: 2024-01-01}", "since"),  # a YAML date: dumped as a string
        ("{scale: .nan}", "scale"),  # dumped as null
        ("{limits: {1: 2}}", "limits"),  # an integer key: dumped as "1"
    ],
)
@pytest.mark.parametrize("field", ["options", "schema"])
def test_free_form_values_json_would_change_are_refused(text: str, where: str, field: str) -> None:
    """A plugin's options and a JSON schema are free-form, but JSON: what the stored JSON would
    give back as another value is refused at validation, naming where it is."""
    kind = {"options": {"type": "plugin", "name": "p"}, "schema": {"type": "json_schema"}}[field]
    raw = kind | {field: spec_yaml_load(text)}
    with pytest.raises(ValidationError) as refused:
        GRADERS.validate_python(raw)
    locs = [".".join(str(p) for p in e["loc"]) for e in refused.value.errors()]
    assert all(loc.startswith(f"{kind['type']}.{field}.{where}") for loc in locs), locs


@pytest.mark.parametrize("text", ["1e5", "0E0", "2.5e3", ".5e1", "1_000e2", "+1E+2"])
def test_a_string_a_spec_file_would_read_as_a_number_is_written_quoted(text: str) -> None:
    """Spec files read YAML 1.2 numbers (`1e-5` is a float); PyYAML's dumper writes these
    strings bare, and a spec file written with it holds a number where a string was (found by
    the property above: a string_check `reference` of "0E0" came back as 0.0)."""
    import yaml

    data = {"reference": text}
    assert spec_yaml_load(yaml.safe_dump(data)) != data  # the trap
    assert spec_yaml_load(spec_yaml_dump(data)) == data
