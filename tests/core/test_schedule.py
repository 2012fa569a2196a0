"""The learning-rate schedule: known values at the points that define it."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from core.config import OptimConfig
from core.training.schedule import lr_at


def optim(**kw: Any) -> OptimConfig:
    return OptimConfig.model_validate({"lr": 1e-3, **kw})


def test_constant_without_warmup_is_lr_everywhere() -> None:
    o = optim()
    assert [lr_at(s, o, 10) for s in (0, 5, 9)] == [1e-3, 1e-3, 1e-3]


def test_warmup_ramps_from_zero_to_lr() -> None:
    o = optim(lr_warmup_steps=10)
    assert lr_at(0, o, 100) == 0.0
    assert lr_at(5, o, 100) == pytest.approx(5e-4)  # mid warm-up: half
    assert lr_at(9, o, 100) == pytest.approx(9e-4)
    assert lr_at(10, o, 100) == 1e-3  # end of warm-up: the full rate
    assert lr_at(99, o, 100) == 1e-3  # constant after it


@pytest.mark.parametrize("floor", [0.0, 0.1])
def test_cosine_after_warmup(floor: float) -> None:
    # 10 warm-up steps, then steps 10..30 decay: the last step (30) of a 31-step run is the floor
    o = optim(schedule="cosine", lr_warmup_steps=10, min_lr_ratio=floor)
    assert lr_at(10, o, 31) == pytest.approx(1e-3)
    assert lr_at(20, o, 31) == pytest.approx((1 + floor) / 2 * 1e-3)  # halfway
    assert lr_at(15, o, 31) == pytest.approx(
        1e-3 * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi / 4)))
    )
    assert lr_at(30, o, 31) == pytest.approx(floor * 1e-3, abs=1e-15)  # last step: the floor


def test_linear_decays_to_the_floor_at_the_last_step() -> None:
    o = optim(schedule="linear", min_lr_ratio=0.2)
    assert lr_at(0, o, 5) == 1e-3
    assert lr_at(2, o, 5) == pytest.approx(0.6e-3)  # halfway: (1 + 0.2) / 2
    assert lr_at(4, o, 5) == pytest.approx(0.2e-3)


def test_decay_never_goes_below_the_floor_or_rises() -> None:
    o = optim(schedule="cosine", lr_warmup_steps=3, min_lr_ratio=0.05)
    lrs = [lr_at(s, o, 40) for s in range(40)]
    assert lrs[:4] == pytest.approx([0.0, 1e-3 / 3, 2e-3 / 3, 1e-3])
    decay = lrs[3:]
    assert all(a >= b for a, b in itertools.pairwise(decay))
    assert min(lrs[3:]) == pytest.approx(0.05e-3)


def test_no_room_to_decay_stays_at_lr() -> None:
    """A one-step run, or one whose warm-up ends at the last step, never decays."""
    assert lr_at(0, optim(schedule="cosine", min_lr_ratio=0.0), 1) == 1e-3
    assert lr_at(4, optim(schedule="linear", lr_warmup_steps=4), 5) == 1e-3


def test_negative_step_is_refused() -> None:
    with pytest.raises(ValueError, match="step must be >= 0"):
        lr_at(-1, optim(), 10)
