"""Steering a run (`core.training.steering`, `core.training.trainer`): a change of the learning
rate, the mask's thresholds or the step count applies at the next step boundary, shows in that
step's metrics, is announced once, and survives a stop and resume through the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.training.steering import (
    SteeringError,
    changed,
    check_change,
    leaves,
    merge_patch,
    steered,
)
from core.training.trainer import TrainerCallback, train
from tests.support.trainer_runs import read_metrics, small_config


def test_merge_patch_follows_rfc_7396() -> None:
    target = {"a": {"b": 1, "c": 2}, "d": [1, 2], "e": 3}
    patch = {"a": {"b": 5, "c": None}, "d": [9], "f": {"g": 1}}
    assert merge_patch(target, patch) == {"a": {"b": 5}, "d": [9], "e": 3, "f": {"g": 1}}
    assert target == {"a": {"b": 1, "c": 2}, "d": [1, 2], "e": 3}  # untouched
    assert merge_patch({"a": 1}, [1]) == [1]
    assert leaves({"optim": {"lr": 1e-4}, "steps": 9}) == {"optim.lr": 1e-4, "steps": 9}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"optim": {"weight_decay": 0.1}}, "optim.weight_decay"),
        ({"rollout": {"group_size": 8}}, "rollout.group_size"),
        ({"optim": {"lr": None}}, "optim.lr"),
        ({"algorithm": {"kl_beta": 0.1}}, "algorithm.kl_beta"),  # no reference model
        ({"model": {}}, "model"),
    ],
)
def test_changes_outside_the_steerable_set_are_refused_naming_the_field(
    patch: dict[str, Any], field: str
) -> None:
    with pytest.raises(SteeringError) as caught:
        check_change(patch, small_config())
    assert caught.value.field == field


def test_allowed_changes_validate_and_report_what_changed() -> None:
    start = small_config()
    patch = {"optim": {"lr": 1e-4}, "algorithm": {"delta_high": 0.3, "mask": "dppo"}, "steps": 9}
    check_change(patch, start)
    check_change({"algorithm": {"kl_beta": 0.0}}, small_config(algorithm={"kl_beta": 0.05}))
    cfg = steered(start, patch)
    assert (cfg.optim.lr, cfg.algorithm.delta_high, cfg.algorithm.mask, cfg.steps) == (
        1e-4,
        0.3,
        "dppo",
        9,
    )
    assert changed(start, cfg) == {
        "optim.lr": 1e-4,
        "algorithm.mask": "dppo",
        "algorithm.delta_high": 0.3,
        "steps": 9,
    }
    with pytest.raises(ValueError, match="temperature"):
        steered(start, {"rollout": {"temperature": -1.0}})


class Steer(TrainerCallback):
    """Hands out `overrides` as version 1 once `after` steps are done; records announcements."""

    def __init__(self, after: int, overrides: dict[str, Any], stop_after: int | None = None):
        self.after, self.overrides, self.stop_after = after, overrides, stop_after
        self.steps = 0
        self.announced: list[tuple[int, int, dict[str, Any]]] = []

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.steps = step

    def config_update(self) -> tuple[int, dict[str, Any]] | None:
        return (1, self.overrides) if self.steps >= self.after else None

    def on_config(self, step: int, version: int, changes: dict[str, Any]) -> None:
        self.announced.append((step, version, changes))

    def should_stop(self) -> bool:
        return self.stop_after is not None and self.steps >= self.stop_after


def test_a_change_applies_from_the_next_step_and_survives_a_resume(tmp_path: Path) -> None:
    cfg = small_config(steps=4, checkpoint_every=1)
    change = {"optim": {"lr": 1e-4}, "algorithm": {"delta_low": 0.05}, "steps": 6}
    steer = Steer(after=2, overrides=change, stop_after=4)
    stopped = train(cfg, tmp_path, callback=steer)
    assert stopped.stopped and stopped.step == 4  # 4 of the 6 steps it now has
    assert steer.announced == [(2, 1, {"optim.lr": 1e-4, "algorithm.delta_low": 0.05, "steps": 6})]
    resumed = train(cfg, tmp_path, resume=True)  # no callback: the checkpoint holds the change
    assert resumed.step == 6 and not resumed.stopped
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in rows] == [3e-3, 3e-3, 1e-4, 1e-4, 1e-4, 1e-4]
    assert [r["delta_low"] for r in rows] == [0.15, 0.15, 0.05, 0.05, 0.05, 0.05]
    assert all(r["delta_high"] == 0.15 for r in rows)


def test_a_change_that_does_not_validate_is_skipped_with_a_warning(tmp_path: Path) -> None:
    warnings: list[str] = []

    class Bad(Steer):
        def on_warning(self, message: str) -> None:
            warnings.append(message)

    steer = Bad(after=1, overrides={"rollout": {"temperature": -1.0}})
    result = train(small_config(steps=3), tmp_path, callback=steer)
    assert result.step == 3 and steer.announced == []
    changes = [w for w in warnings if not w.startswith("run finished with a warning")]
    assert len(changes) == 1 and "config change 1 not applied" in changes[0]
    assert [r["lr"] for r in read_metrics(tmp_path)] == [3e-3] * 3


def test_a_corrections_own_parameters_steer_and_no_others() -> None:
    """The cap and band of the job's correction type may change; a parameter its type lacks,
    its type and its level may not, and a value past a limit fails validation as at submit."""
    tis = small_config(algorithm={"correction": {"type": "tis", "cap": 2.0}})
    patch = {"algorithm": {"correction": {"cap": 3.0}}}
    check_change(patch, tis)
    cfg = steered(tis, patch)
    assert cfg.algorithm.correction.model_dump() == {"type": "tis", "level": "token", "cap": 3.0}
    assert changed(tis, cfg) == {"algorithm.correction.cap": 3.0}

    icepop = small_config(algorithm={"correction": {"type": "icepop"}})
    band = {"algorithm": {"correction": {"low": 0.8, "high": 1.5}}}
    check_change(band, icepop)
    assert changed(icepop, steered(icepop, band)) == {
        "algorithm.correction.low": 0.8,
        "algorithm.correction.high": 1.5,
    }
    for refused, field, why in [
        ({"cap": 3.0}, "algorithm.correction.cap", r"correction \(type 'icepop'\) has no cap"),
        ({"type": "tis"}, "algorithm.correction.type", "cannot change while a job runs"),
        ({"level": "sequence"}, "algorithm.correction.level", "unknown field"),
    ]:
        with pytest.raises(SteeringError, match=why) as caught:
            check_change({"algorithm": {"correction": refused}}, icepop)
        assert caught.value.field == field
    with pytest.raises(SteeringError, match="cannot change while a job runs"):
        check_change({"algorithm": {"correction": {"level": "sequence"}}}, tis)
    with pytest.raises(ValueError, match=r"correction\.icepop\.high"):
        steered(icepop, {"algorithm": {"correction": {"high": 0.999}}})
    # a job without a correction has no cap to steer either
    with pytest.raises(SteeringError, match=r"\(type 'none'\) has no cap"):
        check_change(patch, small_config())


def test_a_steered_band_applies_from_the_next_step(tmp_path: Path) -> None:
    """bf16 rollouts put mu off pi by ~3e-4 in log-ratio: IcePop's default band [0.5, 5] drops
    nothing, the band steered to [0.9995, 1.0005] drops tokens from the next step on."""
    cfg = small_config(
        steps=4,
        checkpoint_every=0,
        rollout={"dtype": "bfloat16"},
        algorithm={"minibatches": 1, "correction": {"type": "icepop"}},
    )
    band = {"algorithm": {"correction": {"low": 0.9995, "high": 1.0005}}}
    steer = Steer(after=2, overrides=band)
    train(cfg, tmp_path, callback=steer)
    announced = {"algorithm.correction.low": 0.9995, "algorithm.correction.high": 1.0005}
    assert steer.announced == [(2, 1, announced)]
    dropped = [r["correction_masked_fraction"] for r in read_metrics(tmp_path)]
    assert dropped[:2] == [0.0, 0.0] and all(0 < d < 1 for d in dropped[2:]), dropped
