"""A stop that keeps the work (a pause, a worker shutdown: `TrainerCallback.stop_keeps_work`)
loses none: stopped during the warm-up, between two minibatch updates of a step, or before the
first periodic checkpoint, the run is checkpointed where it stopped, and the resumed run trains
no step and no warm-up step twice and ends with an uninterrupted run's weights, bit for bit."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import core.training.warmup
from core.rollout import RolloutBatch
from core.training.checkpoint import latest_checkpoint
from core.training.run import TrainingRun as _Run
from core.training.trainer import TrainerCallback, train
from tests.support.trainer_runs import Recorder, read_metrics, small_config, strip_timing


@pytest.fixture
def warmup_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per supervised warm-up step trained, in every run of the test."""
    trained: list[int] = []
    pack = core.training.warmup._pack  # once per warm-up step: its batch

    def counted(*args: Any, **kwargs: Any) -> RolloutBatch:
        trained.append(1)
        return pack(*args, **kwargs)

    monkeypatch.setattr(core.training.warmup, "_pack", counted)
    return trained


class StopAt(Recorder):
    """Says stop once, at its `at`-th question from `where`: the warm-up (`warmup`), a step
    boundary (`boundary`), a rollout (`generate`) or a step's minibatch loop (`update`);
    records logs too."""

    def __init__(self, at: int, where: str, keep: bool = True) -> None:
        super().__init__()
        self.at, self.where, self.keep = at, where, keep
        self.asked = 0
        self.logs: list[str] = []

    def should_stop(self) -> bool:
        frames: list[CodeType] = []
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and len(frames) < 6:
            frames.append(frame.f_code)
            frame = frame.f_back
        callers = [code.co_name for code in frames]
        if self.where == "warmup":
            asked = any(code.co_filename.endswith("core/training/warmup.py") for code in frames)
        elif self.where == "boundary":
            asked = "_train_run" in callers[:2] and "run_step" not in callers
        else:
            asked = self.where in callers
        if not asked:
            return False
        self.asked += 1
        return self.asked == self.at

    def stop_keeps_work(self) -> bool:
        return self.keep

    def on_log(self, message: str) -> None:
        self.logs.append(message)


def assert_same_run(part: Path, full: Path) -> None:
    """Every step once in metrics.jsonl, each equal to the uninterrupted run's, and the same
    final weights."""
    rows = read_metrics(part)
    assert [r["step"] for r in rows] == [r["step"] for r in read_metrics(full)]
    assert strip_timing(rows) == strip_timing(read_metrics(full))
    a = load_file(str(full / "final" / "model.safetensors"))
    b = load_file(str(part / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("extra", [{}, {"rollout": {"staleness": 1}}], ids=["plain", "stale"])
def test_a_stop_during_the_warm_up_checkpoints_it_and_the_resume_continues_it(
    tmp_path: Path, warmup_steps: list[int], extra: dict[str, Any]
) -> None:
    cfg = small_config(steps=3, checkpoint_every=50, task={"warmup_steps": 10}, **extra)
    train(cfg, tmp_path / "full")
    assert len(warmup_steps) == 10
    warmup_steps.clear()

    part = tmp_path / "part"
    cb = StopAt(5, "warmup")  # asked before each warm-up step: 4 done when the 5th is asked
    stopped = train(cfg, part, callback=cb)
    assert (stopped.step, stopped.stopped, stopped.final_model) == (0, True, None)
    assert len(warmup_steps) == 4 and cb.checkpoints == [0]
    assert cb.logs[-1] == (
        "stopped during the warm-up after step 4/10; checkpointed: a resumed run continues "
        "the warm-up at step 5/10"
    )
    ckpt = latest_checkpoint(part)
    assert ckpt is not None and ckpt.name == "step-000000"
    assert json.loads((ckpt / "meta.json").read_text())["warmup"] == {"done": 4, "total": 10}

    again = StopAt(3, "warmup")  # stopped a second time, two warm-up steps later
    assert train(cfg, part, callback=again, resume=True).stopped
    assert len(warmup_steps) == 6 and again.logs[0].endswith("after warm-up step 4/10")
    resumed = Recorder()
    assert train(cfg, part, callback=resumed, resume=True).step == 3
    assert len(warmup_steps) == 10  # no warm-up step twice
    assert resumed.steps == [1, 2, 3]
    assert_same_run(part, tmp_path / "full")


def test_a_run_whose_warm_up_finished_never_runs_it_again(
    tmp_path: Path, warmup_steps: list[int]
) -> None:
    """Stopped right after the warm-up (at the step boundary before step 1), then after step 1."""
    cfg = small_config(steps=3, checkpoint_every=50, task={"warmup_steps": 4})
    train(cfg, tmp_path / "full")
    warmup_steps.clear()
    part = tmp_path / "part"
    first = StopAt(1, "boundary")
    assert train(cfg, part, callback=first).step == 0
    assert len(warmup_steps) == 4 and first.checkpoints == [0]
    meta = json.loads((part / "checkpoints" / "step-000000" / "meta.json").read_text())
    assert meta["warmup"] == {"done": 4, "total": 4}
    assert train(cfg, part, callback=Recorder(stop_after=1), resume=True).step == 1
    assert train(cfg, part, resume=True).step == 3
    assert len(warmup_steps) == 4  # the resumed runs ran none of it
    assert_same_run(part, tmp_path / "full")


@pytest.mark.parametrize("minibatch", [1, 2, 4], ids=["first", "second", "last"])
def test_a_stop_between_minibatches_finishes_the_step_and_checkpoints_it(
    tmp_path: Path, minibatch: int
) -> None:
    """The quickstart's case: stopped inside step 3's updates, long before the first periodic
    checkpoint (step 50); the step is finished and checkpointed, and step 3 is not trained
    again."""
    cfg = small_config(steps=5, checkpoint_every=50, algorithm={"minibatches": 4})
    train(cfg, tmp_path / "full")
    part = tmp_path / "part"

    class InStep3(StopAt):
        def should_stop(self) -> bool:
            return len(self.steps) == 2 and super().should_stop()

    cb = InStep3(minibatch, "update")
    stopped = train(cfg, part, callback=cb)
    assert (stopped.step, stopped.stopped) == (3, True)
    assert cb.steps == [1, 2, 3] and cb.checkpoints == [3]
    assert cb.logs[-1] == (
        "stopped between minibatch updates of step 3; finished the step first and "
        "checkpointed it: a resumed run goes on at step 4"
    )
    resumed = Recorder()
    train(cfg, part, callback=resumed, resume=True)
    assert cb.steps + resumed.steps == [1, 2, 3, 4, 5]  # every step once
    assert_same_run(part, tmp_path / "full")


def test_a_stop_during_a_rollout_before_the_first_checkpoint_checkpoints_the_last_step(
    tmp_path: Path,
) -> None:
    """A stop inside a generation rewinds to the step boundary before it and checkpoints it,
    though no periodic checkpoint was due yet."""
    cfg = small_config(steps=4, checkpoint_every=50)
    train(cfg, tmp_path / "full")

    class InRollout3(StopAt):
        def should_stop(self) -> bool:
            return len(self.steps) == 2 and super().should_stop()

    cb = InRollout3(3, "generate")
    assert train(cfg, tmp_path / "part", callback=cb).step == 2
    assert cb.checkpoints == [2]
    resumed = Recorder()
    train(cfg, tmp_path / "part", callback=resumed, resume=True)
    assert cb.steps + resumed.steps == [1, 2, 3, 4]
    assert_same_run(tmp_path / "part", tmp_path / "full")


class OldCheckpoint(Recorder):
    """Stops after step 2, and strips what this change added to its checkpoints: ones written
    before warm-ups were checkpointed."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        super().on_checkpoint(step, path)
        meta = json.loads((path / "meta.json").read_text())
        del meta["warmup"]
        (path / "meta.json").write_text(json.dumps(meta))
        state = torch.load(path / "state.pt")
        del state["warmup"]
        torch.save(state, path / "state.pt")


def test_a_checkpoint_without_warm_up_state_still_resumes_without_a_warm_up(
    tmp_path: Path, warmup_steps: list[int]
) -> None:
    cfg = small_config(steps=4, checkpoint_every=2, task={"warmup_steps": 3})
    train(cfg, tmp_path / "full")
    part = tmp_path / "part"
    old = OldCheckpoint(stop_after=2)
    assert train(cfg, part, callback=old).step == 2 and old.checkpoints == [2]
    warmup_steps.clear()
    assert train(cfg, part, resume=True).step == 4
    assert warmup_steps == []
    assert_same_run(part, tmp_path / "full")


def test_the_warm_ups_optimizer_state_is_freed_once_it_is_done(tmp_path: Path) -> None:
    """Its moments are twice the trainable weights: RL must not carry them along (as it did
    not when the warm-up's optimizer was a local of the warm-up)."""
    run = _Run(small_config(task={"warmup_steps": 2}), tmp_path, TrainerCallback())
    assert run.warmup() and run.warm.done == 2
    assert dict(run.warm.optimizer.state) == {}
