"""The hooks a caller of `core.training.trainer.train` gets (progress, checkpoints, logs,
evaluations, samples, steering), and the stop protocol that the loop, the update and the caller
share (`Stop`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.parallel.distributed import World
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
        """Whether a stop is requested (`Stop`): True ends the run cleanly. Asked between
        steps, between warm-up steps, before every generated token and before every minibatch
        update, so it must be cheap (no network round trip)."""
        return False

    def stop_keeps_work(self) -> bool:
        """Whether a requested stop keeps work (`Stop`): True (the default: a pause, a
        shutdown) finishes a step whose updates have begun and checkpoints it; False (a cancel,
        which keeps nothing) discards the step's partial update."""
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


class Stop:
    """A stop of the run, in the words the loop, the update and a caller (a worker) share.

    - requested: the caller's `TrainerCallback.should_stop` says True (a pause, a cancel, a
      worker's shutdown, a store gone away);
    - keeps work: `TrainerCallback.stop_keeps_work`. A stop keeps the work done: between steps
      or during a rollout (rewound to the step boundary before it) the last completed step is
      checkpointed, during the warm-up the warm-up steps done are; between two minibatch updates
      the step is finished first and checkpointed, unless the stop keeps no work (a cancel: the
      partial update is discarded, the latest checkpoint kept);
    - heard: a request that keeps work, taken note of between two minibatch updates: the step
      finishes and the run stops at its end.

    One process acts on a request inside a step at once. The ranks of a data-parallel run must
    stop together, so inside a step the callback is still asked (a worker hears the request at
    once and waits for the checkpoint instead of killing the job) but the stop waits for the
    step boundary, where they agree on it."""

    def __init__(self, callback: TrainerCallback, world: World) -> None:
        self.callback = callback
        self.world = world
        self.heard = False
        # the weights hold part of an unfinished step's update (from its first optimizer step)
        self.partial = False

    def at_boundary(self) -> bool:
        """Between steps (and warm-up steps): requested, or heard during the last step; every
        rank gives the same answer."""
        return self.world.agree(self.callback.should_stop() or self.heard)

    def in_step(self) -> bool:
        """Inside a step, before every generated token: requested, and acted on now."""
        requested = self.callback.should_stop()
        return requested and not self.world.parallel

    def between_minibatches(self) -> bool:
        """Between a step's minibatch updates: True for a request that keeps no work (the
        update stops at once); a request that keeps work is heard, and the step goes on."""
        if not self.callback.should_stop() or self.world.parallel:
            return False
        if self.callback.stop_keeps_work():
            self.heard = True
            return False
        return True

    def update_begins(self) -> None:
        """Before each optimizer step of a step: from now on its partial update is in the
        weights."""
        self.partial = True
