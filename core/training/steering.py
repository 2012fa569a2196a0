"""Steering a live run: which settings may change between steps, and how a change is applied.

A change is a JSON merge patch (RFC 7396) of the run's `TrainConfig`, kept as one cumulative
patch over the config the run started with (`overrides`), numbered by a version that only grows.
Applying the cumulative patch to the start config (not to the last applied one) makes a change
idempotent: a resumed run, a replayed message or a checkpoint all reach the same config from the
same (version, overrides).

Only settings the trainer reads afresh at every step may change, and none that would change the
shapes of what a checkpoint holds: the learning rate (the schedule's peak), the mask and its
thresholds, the IS cap, the off-policy correction's cap and band (those its type has: the type
and level are fixed at submit), the sampling temperature, the KL coefficient of a run that has a
reference model, and the number of steps.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from core.config import TrainConfig
from core.config.names import did_you_mean

STEERABLE = (
    "optim.lr",
    "algorithm.mask",
    "algorithm.delta_low",
    "algorithm.delta_high",
    "algorithm.is_cap",
    "algorithm.correction.cap",
    "algorithm.correction.low",
    "algorithm.correction.high",
    "algorithm.correction.eps_low",
    "algorithm.correction.eps_high",
    "algorithm.kl_beta",
    "rollout.temperature",
    "steps",
)
"""Dotted paths inside `train` that may change while a job runs."""


class SteeringError(ValueError):
    """A change that may not be made; `field` is the dotted path it names, `reason` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396: `patch` applied to `target` (neither is modified)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def leaves(patch: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted path: value} of every non-object member of `patch`."""
    out: dict[str, Any] = {}
    for key, value in patch.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{path}."))
        else:
            out[path] = value
    return out


def _is_field(start: TrainConfig, path: str) -> bool:
    """Whether `path` names a setting of the config (a typo does not): followed through the
    nested models; below a plain mapping (free-form settings) any key counts as one."""
    node: Any = start
    for part in path.split("."):
        if not isinstance(node, BaseModel):
            return True
        if part not in type(node).model_fields:
            return False
        node = getattr(node, part)
    return True


def check_change(patch: dict[str, Any], start: TrainConfig) -> None:
    """Raises `SteeringError` for a member of `patch` (train-level) that may not change while
    running: a path outside STEERABLE, a null (the value to remove is not a value to run
    with), or a KL coefficient for a run that started without a reference model."""
    for path, value in leaves(patch).items():
        if path not in STEERABLE and not _is_field(start, path):
            raise SteeringError(
                path,
                f"unknown field {path}{did_you_mean(path, STEERABLE)} (these can change while "
                "a job runs: " + ", ".join(STEERABLE) + ")",
            )
        if path not in STEERABLE:
            raise SteeringError(
                path,
                "cannot change while a job runs; these can: " + ", ".join(STEERABLE),
            )
        if not _is_field(start, path):  # a steerable setting this job's choices lack
            kind = start.algorithm.correction.type
            raise SteeringError(
                path,
                f"the job's correction (type {kind!r}) has no {path.rsplit('.', 1)[-1]}; its "
                "type is fixed at submit",
            )
        if value is None or value == {}:
            raise SteeringError(path, "give the new value (a null would remove the setting)")
        if path == "algorithm.kl_beta" and start.algorithm.kl_beta == 0:
            raise SteeringError(
                path,
                "the job started without a KL penalty (kl_beta 0), so it has no reference "
                "model to measure one against; set kl_beta > 0 at submit to steer it",
            )


def steered(start: TrainConfig, overrides: dict[str, Any]) -> TrainConfig:
    """`start` with the cumulative `overrides` applied, validated like a submitted config
    (pydantic's ValidationError names the field)."""
    merged = merge_patch(start.model_dump(mode="json"), overrides)
    return TrainConfig.model_validate_json(json.dumps(merged))


def values(cfg: TrainConfig) -> dict[str, Any]:
    """The steerable settings `cfg` has, by dotted path (a correction has only its own type's
    parameters)."""
    dumped = cfg.model_dump(mode="json")
    out: dict[str, Any] = {}
    for path in STEERABLE:
        node: Any = dumped
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            out[path] = node
    return out


def changed(before: TrainConfig, after: TrainConfig) -> dict[str, Any]:
    """{path: new value} of the steerable settings that differ."""
    old = values(before)
    return {path: value for path, value in values(after).items() if old.get(path) != value}
