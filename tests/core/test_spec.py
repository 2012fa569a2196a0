"""The job spec and trainer config: shipped examples validate, bad input names field and value."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from core.config import MAX_SEED, SEED_OFFSETS, RolloutConfig, TrainConfig
from core.rollout import sampling_logprobs
from pdppo.client import spec_to_dict
from pdppo.spec import JobSpec, SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_shipped_examples_validate(name: str) -> None:
    spec = load_spec(ROOT / "examples" / name)
    assert isinstance(spec, JobSpec) and spec.train.steps >= 1


def test_quickstart_is_tiny_builtin_predictive() -> None:
    spec = load_spec(ROOT / "examples" / "quickstart.yaml")
    assert spec.train.model.name == "builtin:tiny"
    assert spec.train.algorithm.mask == "predictive"
    assert spec.train.task.name in ("arithmetic", "sort", "copy", "reverse")


def test_json_spec_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"train": {"steps": 3}}')
    spec = load_spec(path)
    assert spec.train.steps == 3 and spec.resources.device == "cpu"
    assert spec.train.algorithm.top_k == 20 and spec.train.algorithm.delta_low == 0.15


@pytest.mark.parametrize(
    ("train", "field", "value"),
    [
        ({"algorithm": {"mask": "clip"}}, "train.algorithm.mask", "clip"),
        ({"steps": 0}, "train.steps", "0"),
        ({"model": {"name": "gpt2"}}, "model.name", "gpt2"),
        ({"task": {"name": "jsonl"}}, "task.path", "jsonl"),
        ({"task": {"min_len": 5, "max_len": 2}}, "task.min_len", "5"),
        ({"algorithm": {"minibatches": 3}}, "algorithm.minibatches", "3"),
        ({"model": {"tiny": {"d_model": 30, "n_heads": 4}}}, "n_heads", "4"),
        ({"rollout": {"group_size": 1}}, "train.rollout.group_size", "1"),
    ],
)
def test_bad_specs_name_field_and_value(
    tmp_path: Path, train: dict, field: str, value: str
) -> None:
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"train": train}))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert field in str(err.value) and value in str(err.value)


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ValidationError, match="learning_rate"):
        TrainConfig.model_validate({"optim": {"learning_rate": 1e-3}})
    with pytest.raises(ValidationError, match="gpu_count"):
        JobSpec.model_validate({"train": {}, "resources": {"gpu_count": 1}})


def test_unreadable_spec_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed")
    with pytest.raises(SpecError, match="not valid"):
        load_spec(bad)


# -- strict validation: one spec must not be able to take a worker down ---------------------


def errors_of(data: dict[str, Any] | str) -> list[tuple[str, str]]:
    """(dotted field, message) of each validation error, from a dict (as the API validates the
    body json.loads made) or from JSON text (as the worker does, `model_validate_json`)."""
    with pytest.raises(ValidationError) as err:
        if isinstance(data, str):
            JobSpec.model_validate_json(data)
        else:
            JobSpec.model_validate(data)
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in err.value.errors()]


@pytest.mark.parametrize(
    ("text", "field", "shown"),
    [
        (
            '{"train": {"optim": {"weight_decay": Infinity}}}',
            "train.optim.weight_decay",
            "Infinity",
        ),
        (
            '{"train": {"algorithm": {"delta_high": 1e400}}}',
            "train.algorithm.delta_high",
            "Infinity",
        ),
        ('{"train": {"optim": {"lr": NaN}}}', "train.optim.lr", "NaN"),
        ('{"train": {"rollout": {"temperature": -Infinity}}}', "train.rollout.temperature", "-Inf"),
        (
            '{"train": {}, "resources": {"timeout_minutes": Infinity}}',
            "resources.timeout_minutes",
            "Inf",
        ),
        ('{"train": {"task": {"numeric_tolerance": NaN}}}', "train.task.numeric_tolerance", "NaN"),
    ],
)
def test_nan_and_infinity_are_refused_naming_the_field(text: str, field: str, shown: str) -> None:
    """`lr: NaN` used to say "less than or equal to 1"; infinities were accepted (and echoed
    back as null). Both paths in: a dict from json.loads (the API) and JSON text (the worker)."""
    for data in (text, json.loads(text)):
        errors = errors_of(data)
        assert len(errors) == 1, errors
        assert errors[0][0] == field
        assert errors[0][1].startswith(f"must be finite (got {shown}")


def test_an_integer_too_large_for_a_float_is_not_finite() -> None:
    assert errors_of({"train": {"optim": {"max_grad_norm": 10**400}}}) == [
        ("train.optim.max_grad_norm", "must be finite (got an integer too large for a float)")
    ]


def test_spec_error_text_names_the_field_once(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    path.write_text('{"train": {"optim": {"lr": NaN}}}')
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value).endswith("train.optim.lr: must be finite (got NaN)")


@pytest.mark.parametrize(
    ("train", "field", "message"),
    [
        ({"steps": "3"}, "train.steps", "Input should be a valid integer"),
        ({"seed": True}, "train.seed", "Input should be a valid integer"),
        ({"seed": False}, "train.seed", "Input should be a valid integer"),
        ({"seed": 1.0}, "train.seed", "Input should be a valid integer"),
        ({"optim": {"weight_decay": True}}, "train.optim.weight_decay", "valid number"),
        ({"optim": {"weight_decay": "0.1"}}, "train.optim.weight_decay", "valid number"),
        ({"algorithm": {"normalize_std": "true"}}, "train.algorithm.normalize_std", "boolean"),
        ({"algorithm": {"normalize_std": 1}}, "train.algorithm.normalize_std", "boolean"),
        ({"rollout": {"staleness": "1"}}, "train.rollout.staleness", "valid integer"),
        ({"rollout": {"staleness": True}}, "train.rollout.staleness", "valid integer"),
        ({"task": {"warmup_steps": True}}, "train.task.warmup_steps", "valid integer"),
        ({"task": {"warmup_steps": "10"}}, "train.task.warmup_steps", "valid integer"),
        ({"model": {"name": 5}}, "train.model.name", "valid string"),
    ],
)
def test_no_type_coercion(train: dict[str, Any], field: str, message: str) -> None:
    for data in ({"train": train}, json.dumps({"train": train})):
        errors = errors_of(data)
        assert [f for f, _ in errors] == [field], errors
        assert message in errors[0][1]


def test_strict_still_takes_ints_for_floats_literals_and_nested_dicts() -> None:
    data = {
        "name": "strict",
        "resources": {"device": "cpu", "timeout_minutes": 30},
        "train": {
            "optim": {"lr": 1, "weight_decay": 0},
            "rollout": {"temperature": 2, "dtype": "bfloat16"},
            "algorithm": {"mask": "dppo", "delta_low": 1, "normalize_std": True},
            "model": {"name": "hf:/data/m", "lora": {"r": 4, "alpha": 8, "target_modules": ["q"]}},
        },
    }
    for spec in (JobSpec.model_validate(data), JobSpec.model_validate_json(json.dumps(data))):
        assert spec.train.optim.lr == 1.0 and isinstance(spec.train.optim.lr, float)
        assert spec.train.rollout.temperature == 2.0 and spec.resources.timeout_minutes == 30.0
        assert spec.train.algorithm.mask == "dppo" and spec.train.algorithm.normalize_std is True
        assert spec.train.model.lora is not None and spec.train.model.lora.alpha == 8.0


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_examples_round_trip_through_json(name: str) -> None:
    """What the API stores (`model_dump_json`) is what the worker loads (`model_validate_json`)."""
    spec = load_spec(ROOT / "examples" / name)
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    assert JobSpec.model_validate(json.loads(spec.model_dump_json())) == spec
    assert JobSpec.model_validate(spec_to_dict(ROOT / "examples" / name)) == spec


@pytest.mark.parametrize(
    ("train", "field", "message"),
    [
        ({"rollout": {"temperature": 1e-300}}, "train.rollout.temperature", "0.01"),
        ({"rollout": {"top_p": 1e-300}}, "train.rollout.top_p", "0.000001"),
        ({"seed": 99999999999999999999999}, "train.seed", str(MAX_SEED)),
        ({"seed": MAX_SEED + 1}, "train.seed", str(MAX_SEED)),
        ({"rollout": {"group_size": 4097}}, "train.rollout.group_size", "4096"),
        ({"rollout": {"prompts_per_step": 65537}}, "train.rollout.prompts_per_step", "65536"),
        ({"algorithm": {"minibatches": 65537}}, "train.algorithm.minibatches", "65536"),
        ({"algorithm": {"top_k": 1001}}, "train.algorithm.top_k", "1000"),
        ({"algorithm": {"is_cap": 1e13}}, "train.algorithm.is_cap", "1000000000000"),
        ({"algorithm": {"delta_low": 101}}, "train.algorithm.delta_low", "100"),
        ({"optim": {"eps": 1e-300}}, "train.optim.eps", "0.0000000000000001"),
        ({"optim": {"weight_decay": 11}}, "train.optim.weight_decay", "10"),
        ({"optim": {"max_grad_norm": 1e10}}, "train.optim.max_grad_norm", "1000000000"),
        ({"checkpoint_every": 10**8}, "train.checkpoint_every", "10000000"),
        ({"keep_checkpoints": 1001}, "train.keep_checkpoints", "1000"),
        ({"task": {"warmup_batch_size": 65537}}, "train.task.warmup_batch_size", "65536"),
        ({"task": {"numeric_tolerance": 1e13}}, "train.task.numeric_tolerance", "1000000000000"),
        ({"task": {"warmup_lr": 2}}, "train.task.warmup_lr", "1"),
        ({"model": {"name": "hf:x", "lora": {"alpha": 1e6}}}, "train.model.lora.alpha", "65536"),
        ({"model": {"name": "hf:x", "lora": {"r": 1025}}}, "train.model.lora.r", "1024"),
    ],
)
def test_numbers_that_crash_or_hang_the_trainer_are_bounded(
    train: dict[str, Any], field: str, message: str
) -> None:
    errors = errors_of({"train": train})
    assert [f for f, _ in errors] == [field], errors
    assert message in errors[0][1]


def _numeric_fields(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for model_name, model in schema.get("$defs", {}).items():
        for field, prop in model.get("properties", {}).items():
            for option in prop.get("anyOf", [prop]):
                if option.get("type") in ("integer", "number"):
                    found.append((f"{model_name}.{field}", option))
    return found


def test_every_number_in_the_spec_has_finite_bounds() -> None:
    fields = _numeric_fields(JobSpec.model_json_schema())
    assert len(fields) > 30
    for name, option in fields:
        assert "maximum" in option or "exclusiveMaximum" in option, name
        assert "minimum" in option or "exclusiveMinimum" in option, name


def test_the_largest_seed_is_one_torch_accepts_with_the_trainers_offsets() -> None:
    with pytest.raises((RuntimeError, ValueError)):  # what an unbounded seed did to the trainer
        torch.Generator().manual_seed(99999999999999999999999)
    assert TrainConfig.model_validate({"seed": MAX_SEED}).seed == MAX_SEED
    torch.Generator().manual_seed(MAX_SEED + SEED_OFFSETS)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(MAX_SEED)
    finally:
        torch.random.set_rng_state(state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_sampler_at_the_lowest_temperature_and_top_p_gives_finite_logprobs(
    dtype: torch.dtype,
) -> None:
    """Logits as the rollout copy produces them (fp16 up to its 65504 range), through
    `sampling_logprobs` at the smallest temperature and top-p the spec allows."""
    low_t = RolloutConfig.model_fields["temperature"].metadata
    t_min = next(m.ge for m in low_t if getattr(m, "ge", None) is not None)
    p_min = next(
        m.ge for m in RolloutConfig.model_fields["top_p"].metadata if getattr(m, "ge", None)
    )
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=gen) * 30
    logits[:, 0], logits[:, 1] = 6e4, -6e4
    logits = logits.to(dtype)
    for top_p in (1.0, p_min):
        logp = sampling_logprobs(logits, t_min, top_p)
        kept = logp[torch.isfinite(logp)]
        assert not torch.isnan(logp).any() and logp.dtype == torch.float32
        assert torch.isfinite(logp).any(-1).all()
        assert torch.allclose(logp.exp().sum(-1), torch.ones(64), atol=1e-5)
        assert kept.max() <= 0
        sampled = torch.multinomial(logp.exp(), 1, generator=gen)
        assert torch.isfinite(logp.gather(-1, sampled)).all()
    assert torch.isfinite(sampling_logprobs(logits, t_min, 1.0)).all()
    assert torch.isnan(sampling_logprobs(logits, 1e-300, 1.0)).any()  # what 1e-300 did


@pytest.mark.parametrize("char", ["\x00", "\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\x9f"])
@pytest.mark.parametrize(
    ("place", "field"),
    [
        (lambda c: {"name": f"job{c}x", "train": {}}, "name"),
        (lambda c: {"train": {"model": {"name": f"hf:/data/m{c}"}}}, "train.model.name"),
        (
            lambda c: {"train": {"task": {"name": "jsonl", "path": f"/data/a{c}.jsonl"}}},
            "train.task.path",
        ),
        (
            lambda c: {"train": {"model": {"name": "hf:m", "lora": {"target_modules": [c]}}}},
            "train.model.lora.target_modules",
        ),
    ],
)
def test_control_characters_are_refused_naming_the_field(char: str, place: Any, field: str) -> None:
    errors = errors_of(place(char))
    assert [f for f, _ in errors] == [field], errors
    assert "must not contain control characters" in errors[0][1]
    assert f"U+{ord(char):04X}" in errors[0][1]


def test_printable_unicode_names_are_fine() -> None:
    spec = JobSpec.model_validate({"name": "café – 試験 🚀", "train": {}})
    assert spec.name == "café – 試験 🚀"


# -- relative paths: `pdppo train` and `pdppo submit` read the same files --------------------


def test_yaml_exponent_floats_are_numbers(tmp_path: Path) -> None:
    """PyYAML reads `1e-5` as a string; strict validation would then refuse a common spelling."""
    path = tmp_path / "lr.yaml"
    path.write_text("train:\n  optim:\n    lr: 1e-5\n    eps: 1.0E-8\n  steps: 3\nname: '1e-5'\n")
    spec = load_spec(path)
    assert spec.train.optim.lr == 1e-5 and spec.train.optim.eps == 1e-8
    assert spec.name == "1e-5"
    assert spec_to_dict(path)["train"]["optim"] == {"lr": 1e-5, "eps": 1e-8}


def _spec_with_paths(folder: Path, model: str, task_path: str) -> Path:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    spec = {"train": {"model": {"name": model}, "task": {"name": "jsonl", "path": task_path}}}
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("hf:gpt2", "hf:gpt2"),
        ("hf:Qwen/Qwen2.5-0.5B", "hf:Qwen/Qwen2.5-0.5B"),
        ("hf:./models/m", "hf:{spec}/models/m"),
        ("hf:models/m", "hf:{spec}/models/m"),  # not a hub id: it exists next to the spec
        ("hf:../shared/m", "hf:{parent}/shared/m"),
        ("hf:~/models/m", "hf:{home}/models/m"),
        ("hf:/abs/m", "hf:/abs/m"),
        ("builtin:tiny", "builtin:tiny"),
    ],
)
def test_train_and_submit_resolve_relative_paths_against_the_spec_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, expected: str
) -> None:
    """`pdppo train` used to read `mydata/add.jsonl` relative to the current directory, while
    `pdppo submit` sent it as is (422). Now both resolve it against the spec file's folder."""
    folder = tmp_path / "project"
    (folder / "models" / "m").mkdir(parents=True)
    _spec_with_paths(folder, model, "mydata/add.jsonl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    want_model = expected.format(
        spec=folder, parent=tmp_path, home=os.path.expanduser("~").rstrip("/")
    )
    local = load_spec(Path("..") / "project" / "job.yaml")
    submitted = spec_to_dict(Path("../project/job.yaml"))
    assert local.train.task.path == str(folder / "mydata" / "add.jsonl")
    assert submitted["train"]["task"]["path"] == str(folder / "mydata" / "add.jsonl")
    assert local.train.model.name == submitted["train"]["model"]["name"] == want_model
    absolute = _spec_with_paths(tmp_path / "abs", "hf:gpt2", "/data/add.jsonl")
    assert load_spec(absolute).train.task.path == "/data/add.jsonl"
    assert spec_to_dict(absolute)["train"]["task"]["path"] == "/data/add.jsonl"


def test_mappings_and_models_are_not_path_resolved() -> None:
    """Only a spec *file* has a folder to resolve against; a mapping goes as given."""
    data = {"train": {"task": {"name": "jsonl", "path": "rel.jsonl"}}}
    assert spec_to_dict(data) == data
    assert parse_spec(data).train.task.path == "rel.jsonl"


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({}, "rollout.engine='vllm' needs a Hugging Face model (hf:<folder or hub id>, or "),
        (
            {"model": {"name": "hf:/m"}, "algorithm": {"estimator": "exact"}},
            "algorithm.estimator='exact' needs the full behavior distribution",
        ),
    ],
    ids=["builtin", "exact"],
)
def test_what_vllm_cannot_serve_is_refused_at_validation(
    train: dict[str, Any], message: str
) -> None:
    """vLLM loads a Hugging Face folder and returns only top-K: a spec it cannot serve fails
    here, at submit, not in the worker."""
    with pytest.raises(ValidationError, match=re.escape(message)):
        TrainConfig.model_validate({**train, "rollout": {"engine": "vllm"}})
    for model in (
        {"name": "hf:/m"},
        {"name": "hf:/m", "lora": {"r": 4}},  # merged into the engine's weights
        {"name": "job:0193a1b2c3d4e5f60718293a4b5c6d7e"},
    ):
        cfg = TrainConfig.model_validate({"model": model, "rollout": {"engine": "vllm"}})
        assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm_memory == 0.3
