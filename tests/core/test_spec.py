"""The job spec and trainer config: shipped examples validate, bad input names field and value."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from core.config import TrainConfig
from pdppo.spec import JobSpec, SpecError, load_spec

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
    with pytest.raises(ValidationError, match="gpus"):
        JobSpec.model_validate({"train": {}, "resources": {"gpus": 1}})


def test_unreadable_spec_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed")
    with pytest.raises(SpecError, match="not valid"):
        load_spec(bad)
