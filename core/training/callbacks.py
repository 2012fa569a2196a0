"""The hooks a caller of `core.training.trainer.train` gets: progress, checkpoints, logs,
evaluations, samples, and the stop question asked inside every step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.training.evaluation import Sample


class TrainerCallback:
    """Hooks for a caller (CLI progress bar, Celery worker). Defaults do nothing."""

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        """After step `step`'s update, before that step's checkpoint is written."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        """A complete checkpoint for `step` now exists at `path`."""

    def on_phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """The run entered phase `name` (one of `PHASES`), or made progress in it: the warm-up
        reports every step as `done` of `total`; `training` starts at step `done` of `total`.
        Lets a caller show what a silent minute is spent on (loading a model, the warm-up)."""

    def on_log(self, message: str) -> None:
        """A human-readable line about the run (warm-up, resume, final model)."""

    def on_warning(self, message: str) -> None:
        """Something the user should act on although the run goes on (nothing is learned)."""
        self.on_log(f"warning: {message}")

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        """The held-out evaluation of the policy after step `step` (`core.training.evaluation`);
        after that step's `on_step` and before its checkpoint."""

    def on_samples(self, step: int, samples: list[Sample]) -> None:
        """A few prompt/completion/reward triples of step `step`'s rollout, after `on_step`."""

    def should_stop(self) -> bool:
        """True ends the run cleanly. Asked between steps, between warm-up steps, before every
        generated token and before every minibatch update, so it must be cheap (no network
        round trip). A stop between steps or during a rollout checkpoints the last completed
        step, one during the warm-up checkpoints the warm-up steps done (a resumed run goes on
        from there), and one in the middle of a step's updates lets the step finish and
        checkpoints it, unless `stop_keeps_work` says False."""
        return False

    def stop_keeps_work(self) -> bool:
        """Asked when `should_stop` said True between two minibatch updates of a step: True
        (the default: a pause, a shutdown) finishes the step's remaining minibatches so that
        the stop checkpoints the step and nothing is trained twice; False (a cancel, which
        keeps nothing) stops at once and discards the step's partial update."""
        return True

    def config_update(self) -> tuple[int, dict[str, Any]] | None:
        """The newest change of the run's steerable settings (`core.training.steering`): its version
        and the cumulative merge patch over the config the run started with, or None. Asked at
        every step boundary; like `should_stop` it must not wait on the network."""
        return None

    def on_config(self, step: int, version: int, changes: dict[str, Any]) -> None:
        """Change `version` applies from step `step + 1` on; `changes`: {dotted path: value}."""

    def on_trackers(self, runs: dict[str, dict[str, str]]) -> None:
        """The experiment-tracker runs this run reports to (`report_to`), once each is open:
        {tracker: {"run_id": ..., "url": ...}} (no url where the tracker has none). Told on
        the training thread, at a step boundary (`core.training.reporting`)."""


PHASES = ("loading model", "warm-up", "training", "evaluating", "saving")
"""What a run does, in the order a fresh run meets them; `training`, `evaluating` and `saving`
then alternate, step after step."""


class Phases:
    """The run's current phase, told to the callback only when it changes, so that the trainer
    may say where it is at every boundary without flooding a caller that publishes each one."""

    def __init__(self, callback: TrainerCallback) -> None:
        self.callback = callback
        self.name: str | None = None

    def enter(self, name: str, done: int | None = None, total: int | None = None) -> None:
        if name == self.name:
            return
        self.name = name
        self.callback.on_phase(name, done, total)
