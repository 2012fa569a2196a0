"""Fixtures that swap the task the trainer builds from its config: `held_out_task` (a held-out
set without a dataset file), `spread_reward` and `zero_reward` (the rewards of every completion)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import core.training.run
from core.config import TaskConfig
from tests.core.held_out import HeldOutReverse
from tests.support.trainer_runs import SpreadReward, ZeroReward


@pytest.fixture
def held_out_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer builds its task from the config; this one has a held-out set without a
    dataset file (the JSONL task's split is tested with it)."""

    def make(cfg: TaskConfig, *args: object, **kwargs: object) -> Any:
        return HeldOutReverse()

    monkeypatch.setattr(core.training.run, "make_task", make)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for the test: reductions add in one order, the same last bits in every
    run (and in a rollout server, which takes the trainer's thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def spread_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    import core.training.run as run_module

    real = run_module.make_task
    monkeypatch.setattr(run_module, "make_task", lambda *a, **kw: SpreadReward(real(*a, **kw)))


@pytest.fixture
def zero_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    import core.training.run as run_module

    real = run_module.make_task
    monkeypatch.setattr(run_module, "make_task", lambda *a, **kw: ZeroReward(real(*a, **kw)))
