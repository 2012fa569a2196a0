"""`TrustRegion`, the settings the loss and the masks read: built from the algorithm config
field by field, checked on construction (each limit at, just past and on the wrong side), and
handed whole to the loss by the trainer."""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError, fields, replace
from typing import Any

import pytest

from core.config import AlgorithmConfig
from core.objective.corrections import Correction
from core.objective.masks import TrustRegion

CHANGED: dict[str, Any] = {
    "mask": "ppo_clip",
    "kind": "kl_reverse",
    "estimator": "binary",
    "delta_low": 0.05,
    "delta_high": 0.3,
    "is_cap": 2.0,
    "kl_beta": 0.1,
    "top_k": 7,
    "correction": {"type": "geo_rs", "low": 0.99, "high": 1.02},  # geo_rs: with is_cap
}
"""A value other than the default for every field."""

CHANGED_REGION = {
    **CHANGED,
    "correction": Correction(type="geo_rs", level="sequence", low=0.99, high=1.02),
}
"""What `CHANGED` becomes in the trust region (the correction is the core's own dataclass)."""


def test_every_field_comes_from_the_config_field_of_its_name() -> None:
    assert sorted(CHANGED) == sorted(f.name for f in fields(TrustRegion))
    region = TrustRegion.from_config(AlgorithmConfig.model_validate(CHANGED))
    assert {f.name: getattr(region, f.name) for f in fields(TrustRegion)} == CHANGED_REGION


def test_the_defaults_are_the_configs() -> None:
    """`policy_loss` without a region and a run with the default algorithm train alike."""
    assert TrustRegion.from_config(AlgorithmConfig()) == TrustRegion()


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("mask", "trpo", r"mask must be one of \('ppo_clip', 'dppo', 'predictive', 'none'\)"),
        ("kind", "js", r"kind must be one of \('tv', 'kl', 'kl_reverse'\)"),
        ("estimator", "full", r"estimator must be one of \('exact', 'binary', 'topk'"),
        ("delta_low", -1e-9, r"deltas must be >= 0, got delta_low=-1e-09, delta_high=0.15"),
        ("delta_high", -1e-9, r"deltas must be >= 0, got delta_low=0.15, delta_high=-1e-09"),
        ("is_cap", 0.0, r"is_cap must be > 0, got 0.0"),
        ("is_cap", -1.0, r"is_cap must be > 0, got -1.0"),
        ("kl_beta", -1e-9, r"kl_beta must be >= 0, got -1e-09"),
        ("top_k", 0, r"top_k must be >= 1, got 0"),
    ],
)
def test_a_value_past_a_limit_is_refused_with_its_name(field: str, value: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        TrustRegion(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("delta_low", 0.0),  # a region of width 0
        ("delta_high", 0.0),
        ("is_cap", 1e-9),  # any cap > 0
        ("is_cap", math.inf),  # the cap off
        ("kl_beta", 0.0),  # no penalty
        ("top_k", 1),
    ],
)
def test_a_value_at_a_limit_is_kept(field: str, value: Any) -> None:
    assert getattr(TrustRegion(**{field: value}), field) == value


def test_it_cannot_change_under_the_loss_and_is_built_by_name() -> None:
    region = TrustRegion()
    with pytest.raises(FrozenInstanceError):
        region.delta_low = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        TrustRegion("dppo")  # type: ignore[misc]  # keyword-only: no two may trade places
    assert replace(region, delta_low=0.5).delta_low == 0.5
