"""An experiment's spec: its arms in order with their names, the child job of each (arm, seed),
and the grids refused before any child exists."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from core.config import MAX_SEED
from core.experiments import Arm, ExperimentSpec, arms, child_spec, seed_list
from pdppo.spec import JobSpec

BASE: dict[str, Any] = {
    "name": "sweep-base",
    "resources": {"device": "cpu"},
    "train": {"algorithm": {"kind": "tv"}, "seed": 3, "steps": 5},
}


def spec(grid: dict[str, list[Any]], **kw: Any) -> ExperimentSpec:
    return ExperimentSpec.model_validate({"base": copy.deepcopy(BASE), "grid": grid, **kw})


def test_arms_of_a_2x3_grid_first_axis_slowest() -> None:
    s = spec(
        {"algorithm.mask": ["dppo", "predictive"], "train.algorithm.delta_high": [0.1, 0.2, 0.3]}
    )
    assert list(s.grid) == ["algorithm.mask", "algorithm.delta_high"]  # "train." stripped
    assert arms(s) == [
        Arm("mask=dppo,delta_high=0.1", {"algorithm.mask": "dppo", "algorithm.delta_high": 0.1}),
        Arm("mask=dppo,delta_high=0.2", {"algorithm.mask": "dppo", "algorithm.delta_high": 0.2}),
        Arm("mask=dppo,delta_high=0.3", {"algorithm.mask": "dppo", "algorithm.delta_high": 0.3}),
        Arm(
            "mask=predictive,delta_high=0.1",
            {"algorithm.mask": "predictive", "algorithm.delta_high": 0.1},
        ),
        Arm(
            "mask=predictive,delta_high=0.2",
            {"algorithm.mask": "predictive", "algorithm.delta_high": 0.2},
        ),
        Arm(
            "mask=predictive,delta_high=0.3",
            {"algorithm.mask": "predictive", "algorithm.delta_high": 0.3},
        ),
    ]
    assert s.baseline_arm == "mask=dppo,delta_high=0.1"


def test_arm_names_use_full_paths_where_last_segments_clash_and_json_for_non_strings() -> None:
    s = spec(
        {
            "model.dtype": ["bfloat16"],
            "rollout.dtype": ["float32"],
            "algorithm.fused_loss": [True],
            "optim.lr": [None],
        }
    )
    assert [a.name for a in arms(s)] == [
        "model.dtype=bfloat16,rollout.dtype=float32,fused_loss=true,lr=null"
    ]


def test_child_spec_sets_overrides_and_seed_and_leaves_base_untouched() -> None:
    s = spec({"algorithm.mask": ["predictive"], "optim.lr": [0.01]}, seeds=2, name="masks")
    before = copy.deepcopy(s.base)
    arm = arms(s)[0]
    child = child_spec(s, arm, 4)
    assert child == {
        "name": "masks/mask=predictive,lr=0.01/seed4",
        "resources": {"device": "cpu"},
        "train": {
            "algorithm": {"kind": "tv", "mask": "predictive"},
            "optim": {"lr": 0.01},  # a section the base left to its defaults
            "seed": 4,
            "steps": 5,
        },
    }
    assert s.base == before
    child["train"]["algorithm"]["kind"] = "kl"
    assert s.base == before  # a deep copy: editing the child does not reach the base
    assert JobSpec.model_validate(child).train.algorithm.mask == "predictive"


def test_child_values_are_copies_of_the_grid_values() -> None:
    s = spec({"model.tiny": [{"d_model": 64, "n_layers": 2}]})
    child = child_spec(s, arms(s)[0], 3)
    assert child["train"]["model"] == {"tiny": {"d_model": 64, "n_layers": 2}}
    child["train"]["model"]["tiny"]["d_model"] = 8
    assert s.grid == {"model.tiny": [{"d_model": 64, "n_layers": 2}]}
    assert arms(s)[0].name == 'tiny={"d_model": 64, "n_layers": 2}'


def test_child_names_fall_back_to_the_base_name_then_experiment_and_are_cut() -> None:
    s = spec({"algorithm.mask": ["dppo"]})
    assert child_spec(s, arms(s)[0], 3)["name"] == "sweep-base/mask=dppo/seed3"
    anon = ExperimentSpec.model_validate({"base": {"train": {}}, "grid": {"steps": [2]}})
    assert child_spec(anon, arms(anon)[0], 0)["name"] == "experiment/steps=2/seed0"
    long = spec({"algorithm.mask": ["dppo"]}, name="x" * 100)
    name = child_spec(long, Arm("a" * 150, {}), 0)["name"]
    assert name == ("x" * 100 + "/" + "a" * 150)[:200] and len(name) == 200


def test_seed_list_starts_at_the_base_seed() -> None:
    assert seed_list(spec({"steps": [1]}, seeds=4)) == [3, 4, 5, 6]
    anon = ExperimentSpec.model_validate({"base": {"train": {}}, "grid": {"steps": [2]}})
    assert seed_list(anon) == [0, 1, 2, 3]


def test_a_union_section_accepts_a_field_of_any_member() -> None:
    """task.grader is a union of grader models: `pattern` is RegexGrader's."""
    assert list(spec({"task.grader.pattern": ["a", "b"]}).grid) == ["task.grader.pattern"]


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"algorithm.maks": ["dppo"]}, r"train.algorithm has no field 'maks' \(its fields: .*mask"),
        ({"train.algorithm.mask.x": ["dppo"]}, r"train.algorithm.mask has no field 'x'"),
        ({"lr": [0.1]}, r"train has no field 'lr'"),
        ({"seed": [0, 1]}, r"'seed' cannot be an axis"),
        ({"train.seed": [0, 1]}, r"'train.seed' cannot be an axis"),
        ({"algorithm.delta_high": [0.1, 0.2, 0.1]}, r"value 0.1 given twice"),
        ({"algorithm.mask": []}, r"1 to 16 values \(got 0\)"),
        ({"steps": list(range(1, 18))}, r"1 to 16 values \(got 17\)"),
        ({"steps": [1], "train.steps": [2]}, r"axis 'steps' given twice"),
        ({"model.tiny": [{"d_model": 8}], "model.tiny.d_model": [8]}, r"overlap"),
        ({}, r"1 to 4 axes \(got 0\)"),
        (
            {
                k: [1]
                for k in ("steps", "optim.lr", "algorithm.top_k", "rollout.top_p", "task.min_len")
            },
            r"1 to 4 axes \(got 5\)",
        ),
        (
            {"steps": [1, 2, 3, 4, 5], "algorithm.top_k": [1, 2, 3, 4, 5], "optim.lr": [1, 2, 3]},
            r"makes 75 arms, more than 64",
        ),
        ({"optim.lr": [float("nan")]}, r"not a JSON value"),
        ({"rollout.top_p": [1, "1"]}, r"two arms would both be named 'top_p=1'"),
        # the name given twice, not the first arm's
        ({"rollout.top_p": [0.5, 1, "1"]}, r"two arms would both be named 'top_p=1'"),
    ],
)
def test_bad_grids_are_refused(grid: dict[str, list[Any]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(grid)


def test_4x4x4_is_the_largest_three_axis_grid() -> None:
    s = spec({"steps": [1, 2, 3, 4], "algorithm.top_k": [1, 2, 3, 4], "optim.lr": [1, 2, 3, 4]})
    assert len(arms(s)) == 64


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"baseline": "mask=none"}, r"baseline 'mask=none' is not an arm \(arms: mask=dppo\)"),
        ({"seeds": 0}, r"greater than or equal to 1"),
        ({"seeds": 65}, r"less than or equal to 64"),
        ({"name": ""}, r"at least 1 character"),
        ({"name": "x" * 101}, r"at most 100 characters"),
        ({"extra": 1}, r"Extra inputs are not permitted"),
        ({"base": {"name": "b"}}, r"base must be a job spec with a `train` mapping"),
        ({"base": {"train": {"seed": "1"}}}, r"train.seed must be an integer"),
        ({"base": {"train": {"seed": MAX_SEED - 2}}, "seeds": 4}, r"past train.seed's limit"),
        # strict: a JSON string or float is not the count it looks like
        ({"seeds": "4"}, r"Input should be a valid integer"),
        ({"seeds": 4.0}, r"Input should be a valid integer"),
    ],
)
def test_bad_specs_are_refused(fields: dict[str, Any], message: str) -> None:
    body = {"base": copy.deepcopy(BASE), "grid": {"algorithm.mask": ["dppo"]}, **fields}
    with pytest.raises(ValidationError, match=message):
        ExperimentSpec.model_validate(body)


def test_seeds_may_run_to_the_seed_limit_itself() -> None:
    body = {"base": {"train": {"seed": MAX_SEED - 3}}, "grid": {"algorithm.mask": ["dppo"]}}
    assert seed_list(ExperimentSpec.model_validate(body))[-1] == MAX_SEED


def test_the_baseline_may_be_any_arm() -> None:
    s = spec({"algorithm.mask": ["dppo", "predictive"]}, baseline="mask=predictive")
    assert s.baseline_arm == "mask=predictive"
