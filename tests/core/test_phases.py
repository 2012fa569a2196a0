"""What a run tells its caller it is doing (`TrainerCallback.on_phase`), and the verdict on a run
that learned nothing (`core.training.silence.run_warnings`, `TrainResult.warnings`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.training.silence import RunWarning, run_warnings
from core.training.trainer import TrainerCallback, train
from tests.core.held_out import run_config
from tests.support.trainer_runs import small_config

Event = tuple[object, ...]


class Phases(TrainerCallback):
    """Records phases among the steps, evaluations and checkpoints they frame."""

    def __init__(self, stop_at_step: int | None = None) -> None:
        self.events: list[Event] = []
        self.stop_at_step = stop_at_step
        self.step = 0

    def on_phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        self.events.append((name, done, total))

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.step = step
        self.events.append(("step", step))

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self.events.append(("eval", step))

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.events.append(("checkpoint", step))

    def should_stop(self) -> bool:
        return self.stop_at_step is not None and self.step >= self.stop_at_step


@pytest.mark.usefixtures("held_out_task")
def test_a_run_names_each_phase_once_as_it_enters_it(tmp_path: Path) -> None:
    plain = run_config(tmp_path, steps=3, eval_every=2, eval_on_start=True)
    # the fixture's task is a held-out `reverse` (its records have no answer field to check)
    warm = {"name": "reverse", "warmup_steps": 3}
    cfg = plain.model_copy(update={"task": plain.task.model_copy(update=warm)})
    rec = Phases()
    train(cfg, tmp_path / "run", callback=rec)
    assert rec.events == [
        ("loading model", None, None),
        ("warm-up", 0, 3), ("warm-up", 1, 3), ("warm-up", 2, 3), ("warm-up", 3, 3),
        ("evaluating", None, None), ("eval", 0),
        ("training", 0, 3), ("step", 1),
        ("step", 2), ("evaluating", None, None), ("eval", 2),
        ("saving", None, None), ("checkpoint", 2),
        ("training", 2, 3), ("step", 3), ("evaluating", None, None), ("eval", 3),
        ("saving", None, None), ("checkpoint", 3),
    ]  # fmt: skip


def test_a_resumed_run_loads_then_trains_from_its_checkpoint_without_a_warm_up(
    tmp_path: Path,
) -> None:
    cfg = small_config(steps=4, checkpoint_every=2, task={"warmup_steps": 2})
    first = Phases(stop_at_step=2)
    train(cfg, tmp_path, callback=first)
    assert first.events[-3:] == [("step", 2), ("saving", None, None), ("checkpoint", 2)]
    again = Phases()
    train(cfg, tmp_path, callback=again, resume=True)
    assert again.events[:3] == [("loading model", None, None), ("training", 2, 4), ("step", 3)]


def row(zero_adv: float, mean: float, std: float) -> dict[str, float]:
    return {"zero_adv_groups": zero_adv, "reward_mean": mean, "reward_std": std}


@pytest.mark.parametrize(
    ("metrics", "evals", "codes"),
    [
        ([], [], []),  # no step: nothing to judge
        ([row(1.0, 0.0, 0.0)] * 3, [], ["no_reward_variance", "rewards_all_zero"]),
        ([row(1.0, 0.5, 0.5)] * 3, [], ["no_reward_variance"]),  # constant within groups only
        ([row(1.0, 0.0, 0.0), row(0.75, 0.1, 0.3)], [], []),  # one step had a signal
        ([row(1.0, 0.0, 0.0), row(0.5, 0.0, 1.0)], [], []),  # rewards -1 and 1: mean 0, not all 0
        ([row(0.5, 0.2, 0.4)], [{"eval_reward_mean": 0.25}] * 2, ["eval_unchanged"]),
        ([row(0.5, 0.2, 0.4)], [{"eval_reward_mean": 0.25}], []),  # one evaluation: no verdict
        ([row(0.5, 0.2, 0.4)], [{"eval_reward_mean": 0.25}, {"eval_reward_mean": 0.5}], []),
    ],
)
def test_run_warnings_judge_the_whole_history(
    metrics: list[dict[str, float]], evals: list[dict[str, float]], codes: list[str]
) -> None:
    assert [w.code for w in run_warnings(metrics, evals)] == codes


def test_warning_messages_say_what_was_seen() -> None:
    (variance, zero) = run_warnings([row(1.0, 0.0, 0.0)] * 3, [])
    assert variance == RunWarning(
        "no_reward_variance",
        "in every one of the 3 steps, all completions of each prompt got the same reward: "
        "every advantage was 0, so the rewards taught the model nothing",
    )
    assert zero.message.startswith("every reward of all 3 steps was 0: the grader never matched")
    (unchanged,) = run_warnings([row(0.5, 0.2, 0.4)], [{"eval_reward_mean": 0.25}] * 3)
    assert "was 0.25 at each of the 3 evaluations" in unchanged.message


@pytest.mark.usefixtures("zero_reward")
def test_a_run_whose_grader_never_matched_succeeds_with_warnings(tmp_path: Path) -> None:
    class Logs(TrainerCallback):
        def __init__(self) -> None:
            self.warnings: list[str] = []

        def on_warning(self, message: str) -> None:
            self.warnings.append(message)

    logs = Logs()
    result = train(small_config(steps=3, silent_steps=0), tmp_path, callback=logs)
    assert result.final_model is not None and not result.stopped
    assert [w.code for w in result.warnings] == ["no_reward_variance", "rewards_all_zero"]
    assert logs.warnings == [
        f"run finished with a warning ({w.code}): {w.message}" for w in result.warnings
    ]


@pytest.mark.usefixtures("spread_reward")
def test_a_run_that_had_a_signal_ends_without_warnings(tmp_path: Path) -> None:
    assert train(small_config(steps=2), tmp_path).warnings == []
