"""The RL loop: GRPO-style groups, the trust-region loss, checkpoints, and a callback for callers.

How this departs from the textbook GRPO loop, on purpose:
- the behavior policy is whatever sampled the tokens, recorded by the rollout engine as a top-K
  view (`core.rollout`); knobs make it differ from the trained policy the way real systems do:
  a lower-precision rollout copy, stale rollout weights (the policy `staleness` steps ago), and
  several minibatch updates per rollout batch;
- the loss is DPPO's `- A * sg(min(pi/mu, c)) * m * log pi(a)` with the configured mask, not the
  PPO clipped objective; GRPO's KL penalty to the initial policy (k3) is optional
  (`algorithm.kl_beta`, `core.training.reference`) and off by default: β = 0 builds no reference
  model;
- the learning rate is a pure function of the step (`core.training.schedule`), so a resumed run
  needs no scheduler state; a minibatch may be split into `optim.grad_accumulation` micro-batches
  whose gradients add up to the unsplit one (token sums over the whole minibatch's token count);
- an optional format warm-up (supervised, random content) runs once before RL when the task asks.

A stop (`TrainerCallback.should_stop`) keeps the work done: between steps or during a rollout
(rewound to the step boundary before it) the last completed step is checkpointed; during the
warm-up, the warm-up steps done are (step 0's checkpoint, `core.training.warmup`); between two
minibatch updates the step is finished first and checkpointed, unless the callback's
`stop_keeps_work` says False (a cancel: the partial update is discarded, the latest checkpoint
kept). A resumed run goes on from exactly there and equals an uninterrupted one bit for bit
(tests/core).

One step = one rollout batch (prompts_per_step x group_size completions) followed by
epochs x minibatches optimizer updates. Metrics are flat floats, one JSON line per step. A run's
state and its step live in `core.training.run`; this module is the loop around them (stops,
evaluations, checkpoints, resume, steering at step boundaries). The final model, like a checkpoint,
is written under a temporary name, fsync'ed and renamed whole (`core.disk.atomic_dir`): a run killed
while saving it leaves no `final/`.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.config import TrainConfig
from core.disk.atomic_dir import discard_dir, write_dir_atomically
from core.graders import GraderOptions
from core.parallel.distributed import World
from core.parallel.sharding import full_state, gathered
from core.rollout import StopRequested
from core.tracking import Reporter, TrackingOptions
from core.training.callbacks import TrainerCallback
from core.training.checkpoint import latest_checkpoint, load_checkpoint, warmup_unfinished
from core.training.devices import _adamw_kernel
from core.training.devices import (
    build_optimizer as build_optimizer,  # re-exported: callers import these here
)
from core.training.devices import resolve_device as resolve_device
from core.training.evaluation import RunResults
from core.training.reporting import ReportingCallback, tracking_for
from core.training.run import _Run
from core.training.silence import RunWarning, run_warnings
from core.training.update import group_advantages as group_advantages

if TYPE_CHECKING:
    import torch


@dataclass
class TrainResult:
    step: int  # last completed step
    stopped: bool  # True when the callback asked to stop before `config.steps`
    final_model: Path | None  # out_dir/final, written only when the run completed
    # what a completed run learned nothing from (`core.training.silence.run_warnings`); rank 0's
    # alone
    warnings: list[RunWarning] = field(default_factory=list)


def train(
    config: TrainConfig,
    out_dir: Path,
    *,
    callback: TrainerCallback | None = None,
    resume: bool = False,
    data_roots: Sequence[str] | None = None,
    file_paths: Mapping[str, Path] | None = None,
    model_dir: Path | None = None,
    world: World | None = None,
    tracking: TrackingOptions | None = None,
    grader_options: GraderOptions | None = None,
) -> TrainResult:
    """Run (or, with resume=True, continue from the latest checkpoint in out_dir) a training run.

    `world`: this process's rank when the run is data-parallel (`core.parallel.distributed`): every
    rank calls `train` with the same config and out_dir; each trains on its share of every step's
    groups, and rank 0 alone writes (metrics, checkpoints, results, the final model) and reports
    through its callback. A stop is agreed at step boundaries (and between warm-up steps): all
    ranks stop together, and the checkpoint keeps what they trained (see the module docstring).
    `data_roots`: the only folders local models and datasets may be read from, symlinks resolved
    (a service passes its operator's roots; None, for a local run, allows any path).
    `file_paths`: local paths of the uploaded files the spec names, by file id (the worker's).
    `model_dir`: the final-model folder a `model.name: job:<id>` stands for (the worker's).
    `tracking`: where the trackers of `config.report_to` report, and the operator's own
    (`core.tracking.TrackingOptions`; None: each tracker's defaults, TensorBoard under
    `out_dir`); rank 0 alone reports, off the training thread (`core.training.reporting`).
    `grader_options`: what the operator lets OpenAI graders do (`core.graders.GraderOptions`;
    None: no python, no score_model)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank0 = world is None or world.rank == 0
    reporting = tracking_for(config, tracking) if rank0 else None
    inner = callback or TrainerCallback()
    # a run that reports nowhere keeps its caller's callback as it is
    cb = ReportingCallback(inner) if reporting is not None else inner
    run = _Run(config, out_dir, cb, data_roots, file_paths, model_dir, world, grader_options)
    try:
        return _train_run(run, resume, reporting)
    finally:
        try:
            if isinstance(cb, ReportingCallback):
                cb.close()  # the trackers' last reports, for a bounded time
        finally:
            run.task.close()  # its grading server, if it has one


def _train_run(run: _Run, resume: bool, tracking: TrackingOptions | None) -> TrainResult:
    config, out_dir, cb = run.cfg, run.out_dir, run.cb
    writer = run.world.rank == 0  # the one rank that writes files (all of them are replicas)
    # eval.jsonl, samples.jsonl
    results = RunResults(_results_cfg(run), out_dir, run.task, run.lm, cb)
    metrics_path = out_dir / "metrics.jsonl"
    ckpt = latest_checkpoint(out_dir) if resume else None
    if ckpt is not None:
        # stopped during the warm-up: the checkpoint holds the warm-up's optimizer
        warming = warmup_unfinished(ckpt)
        run.step, state = load_checkpoint(
            ckpt, run.lm, run.warm.optimizer if warming else run.optimizer
        )
        for group in run.optimizer.param_groups:
            group.update(_adamw_kernel(run.device))
        run.restore(state)
        results.cfg = _results_cfg(run)  # the steered config the checkpoint ran with
        if writer:
            _truncate_metrics(metrics_path, run.step)
            results.resume(run.step)
        w = run.warm
        where = f"after warm-up step {w.done}/{w.total}" if warming else f"at step {run.step}"
        cb.on_log(f"resumed from {ckpt} {where}")
    elif writer:
        # a fresh run owns its output dir: stale checkpoints would poison a later resume
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
        discard_dir(out_dir / "final")
        metrics_path.write_text("")
        results.reset()
    if tracking is not None and isinstance(cb, ReportingCallback):
        # a resumed run continues its tracker runs (from its checkpoint, or from the start)
        resume_step = run.step if ckpt is not None else (0 if resume else None)
        reporter = Reporter(tracking, out_dir, resume_step=resume_step)
        cb.attach(reporter, config, out_dir if ckpt is not None and writer else None)
    if ckpt is None:
        _steer(run, results)  # a change made while the job was queued applies from the start
    # a checkpoint stopped during the warm-up is no step's: step 0 is saved again after it
    last_saved = run.step if ckpt is not None and run.warm.finished else -1
    if not run.warmup():  # a fresh run's, or the rest of a stopped one's (checkpointed)
        done, total = run.warm.done, run.warm.total
        cb.on_log(
            f"stopped during the warm-up after step {done}/{total}; checkpointed: a resumed run "
            f"continues the warm-up at step {done + 1}/{total}"
        )
        return TrainResult(step=0, stopped=True, final_model=None)
    # a run stopped during an evaluation was checkpointed without it: it is owed now
    stopped = _evaluate(run, results, last_saved)
    if stopped is not None:
        return stopped
    with metrics_path.open("a", encoding="utf-8") if writer else nullcontext() as mf:
        while _steer(run, results) and run.step < run.cfg.steps:
            # a stop heard between the last step's minibatches let the step finish: it holds
            if run.world.agree(cb.should_stop() or run.stop_heard):
                if last_saved != run.step:
                    run.checkpoint()
                if run.stop_heard:
                    cb.on_log(
                        f"stopped between minibatch updates of step {run.step}; finished the "
                        f"step first and checkpointed it: a resumed run goes on at step "
                        f"{run.step + 1}"
                    )
                else:
                    cb.on_log(f"stopped at step {run.step}")
                return TrainResult(step=run.step, stopped=True, final_model=None)
            run.phases.enter("training", run.step, run.cfg.steps)
            try:
                metrics = run.run_step()
            except StopRequested as stop:
                if run.dirty:
                    kept = (
                        f"the latest checkpoint (step {last_saved}) is kept"
                        if last_saved >= 0
                        else "there is no checkpoint yet"
                    )
                    cb.on_log(
                        f"{stop} of step {run.step + 1}; its partial update is discarded; {kept}"
                    )
                    return TrainResult(step=run.step, stopped=True, final_model=None)
                if last_saved != run.step:
                    run.checkpoint()
                cb.on_log(f"{stop} of step {run.step + 1}; stopped at step {run.step}")
                return TrainResult(step=run.step, stopped=True, final_model=None)
            _check_finite(metrics)
            if mf is not None:
                mf.write(json.dumps(metrics) + "\n")
                mf.flush()
            cb.on_step(run.step, metrics)
            results.after_step(run.step, run.last_rollout)
            stopped = _evaluate(run, results, last_saved)
            if stopped is not None:
                return stopped
            every = config.checkpoint_every
            if (every and run.step % every == 0) or run.step == run.cfg.steps:
                run.checkpoint()
                last_saved = run.step
    final = out_dir / "final"
    run.phases.enter("saving")
    if run.sharded:  # gathered on rank 0, by every rank
        state = full_state(run.lm.module)
        if writer:
            write_dir_atomically(
                final,
                lambda tmp: run.lm.save_final_state(tmp, state),
                _tensor_bytes(state.values()),
            )
    elif writer:
        weights = run.lm.module.state_dict().values()
        write_dir_atomically(
            final,
            lambda tmp: run.lm.save_final(tmp, merged=config.save_merged),
            _tensor_bytes(weights),
        )
    warnings: list[RunWarning] = []
    if writer:
        cb.on_log(f"final model saved to {final}")
        warnings = run_warnings(_jsonl_rows(metrics_path), _jsonl_rows(results.eval_path))
        for warning in warnings:
            cb.on_warning(f"run finished with a warning ({warning.code}): {warning.message}")
    return TrainResult(step=run.step, stopped=False, final_model=final, warnings=warnings)


def _steer(run: _Run, results: RunResults) -> bool:
    """Apply the caller's newest config change, if any, at this step boundary (always True, to
    sit in the loop's condition). A change that does not validate is reported and skipped. The
    results follow the new step count (the last step's evaluation and samples)."""
    update = run.world.from_rank0(run.cb.config_update())  # rank 0's callback hears of it
    if update is None or update[0] <= run.config_version:
        return True
    version, overrides = update
    try:
        changes = run.steer(version, overrides)
    except ValueError as exc:
        run.config_version = version  # not asked again
        run.cb.on_warning(f"config change {version} not applied: {exc}")
        return True
    results.cfg = _results_cfg(run)
    run.cb.on_config(run.step, version, changes)
    return True


def _results_cfg(run: _Run) -> TrainConfig:
    """What the run's results follow: its config on rank 0; on the other ranks, none of the
    evaluations or samples (rank 0 writes and reports those)."""
    if run.world.rank == 0:
        return run.cfg
    return run.cfg.model_copy(update={"eval_every": 0, "log_samples_every": 0})


def _evaluate(run: _Run, results: RunResults, last_saved: int) -> TrainResult | None:
    """The held-out evaluation due after `run.step`, if not done yet. A stop during it ends the
    run with the step checkpointed and its evaluation undone: the resumed run evaluates that
    step first, with the same generator seed, so the numbers are the ones it would have had."""
    if results.owes(run.step):
        run.phases.enter("evaluating")
    try:
        with _gathered_for_eval(run):
            results.evaluate_if_owed(run.step)
    except StopRequested as stop:
        if last_saved != run.step:
            run.checkpoint()
        run.cb.on_log(
            f"{stop} of step {run.step}; stopped at step {run.step} (evaluated on resume)"
        )
        return TrainResult(step=run.step, stopped=True, final_model=None)
    return None


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop lines past the checkpoint so a resumed run's file equals an uninterrupted one."""
    if not path.exists():
        return
    keep = [
        line
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line)["step"] <= step
    ]
    path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


def _jsonl_rows(path: Path) -> list[dict[str, float]]:
    """The rows of a run's `{"step": ...}` JSONL file (metrics, evaluations)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _check_finite(metrics: dict[str, float]) -> None:
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    if bad:
        raise FloatingPointError(f"non-finite metrics at step {int(metrics['step'])}: {bad}")


def _gathered_for_eval(run: _Run) -> AbstractContextManager[None]:
    """A sharded run's weights gathered on every rank when an evaluation may be due at this
    step (rank 0 alone evaluates, and its forwards must call no collective:
    `core.parallel.sharding`)."""
    cfg, step = run.cfg, run.step
    every = cfg.eval_every
    due = bool(every) and (
        (step == 0 and cfg.eval_on_start) or (step > 0 and (step % every == 0 or step == cfg.steps))
    )
    return gathered(run.lm) if run.sharded and due else nullcontext()


def _tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """What the final model's weights take on disk, about (a LoRA model's merged ones less):
    checked free before its save, so a full disk refuses it whole rather than midway."""
    return sum(t.numel() * t.element_size() for t in tensors)
