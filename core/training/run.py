"""One training run, start to end: the RL recipe a reader follows top to bottom.

`TrainingRun.train` starts or resumes, runs the step loop and saves the final model;
`TrainingRun.run_step` is one step: rollout, group advantages, the update, the step's metrics. The
run's state (model, optimizer, rollout copy or vLLM engine, generators, steering, warm-up) is
this class's, checkpointed and restored as a whole. `core.training.trainer.train` is the entry
point around it.

How this departs from the textbook GRPO loop, on purpose:
- the behavior policy is whatever sampled the tokens, recorded by the rollout engine as a top-K
  view (`core.rollout`); knobs make it differ from the trained policy the way real systems do:
  a lower-precision rollout copy, stale rollout weights (the policy `staleness` steps ago), and
  several minibatch updates per rollout batch;
- the loss is DPPO's `- A * sg(min(pi/mu, c)) * m * log pi(a)` with the configured mask, not the
  PPO clipped objective (`core.objective`, given the run's `TrustRegion`); GRPO's KL penalty to
  the initial policy (k3) is optional (`algorithm.kl_beta`, `core.training.reference`) and off
  by default: β = 0 builds no reference model;
- the learning rate is a pure function of the step (`core.training.schedule`), so a resumed run
  needs no scheduler state; a minibatch may be split into `optim.grad_accumulation` micro-batches
  whose gradients add up to the unsplit one (`core.training.update`);
- an optional format warm-up (supervised, random content) runs once before RL when the task asks;
- with `rollout.mode: async` the rollout is sampled by a server in its own process
  (`core.rollout.server`) that works on the next steps' groups during the update; the loop
  draws the prompts, sends the weights after each update and grades what comes back. A
  checkpoint of an async run keeps no in-flight batch: the resumed run asks for those prompts
  again (the prompt generator is saved as before their draw).

A stop keeps the work done (`core.training.callbacks.Stop`), and a resumed run goes on from
exactly there and equals an uninterrupted one bit for bit (tests/core). One step = one rollout
batch (prompts_per_step x group_size completions) followed by epochs x minibatches optimizer
updates. Metrics are flat floats, one JSON line per step. The final model, like a checkpoint, is
written under a temporary name, fsync'ed and renamed whole (`core.disk.atomic_dir`): a run
killed while saving it leaves no `final/`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from core.config import TrainConfig
from core.disk.atomic_dir import discard_dir, write_dir_atomically
from core.environments.task import EnvironmentTask
from core.graders import GraderOptions
from core.models import CausalLM, load_model
from core.models.base import check_chat_prompts, encode_example
from core.parallel.distributed import World, check_world
from core.parallel.sharding import full_state, gathered, shard
from core.rollout import RolloutBatch, SamplingOptions, StopRequested, generate
from core.rollout.episodes import ChatDelta, run_episodes
from core.rollout.server import RolloutServer, Sampling
from core.tasks import Example, Task, make_task
from core.tracking import Reporter, TrackingOptions
from core.training.callbacks import Phases, Stop, TrainerCallback
from core.training.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_sharded_checkpoint,
    warmup_unfinished,
)
from core.training.devices import adamw_kernel, build_optimizer, resolve_device
from core.training.evaluation import RunResults, StepRollout
from core.training.reference import ReferencePolicy
from core.training.reporting import ReportingCallback
from core.training.schedule import lr_at
from core.training.silence import RunWarning, SilenceWatch, run_warnings, zero_adv_groups
from core.training.steering import changed, steered
from core.training.update import group_advantages, update_policy
from core.training.warmup import Warmup

if TYPE_CHECKING:
    from core.rollout.vllm_engine import VLLMEngine

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TrainResult:
    step: int  # last completed step
    stopped: bool  # True when the callback asked to stop before `config.steps`
    final_model: Path | None  # out_dir/final, written only when the run completed
    # what a completed run learned nothing from (`core.training.silence.run_warnings`); rank 0's
    # alone
    warnings: list[RunWarning] = field(default_factory=list)


@dataclass(frozen=True)
class _Rollout:
    """One step's sampled batch and its grades."""

    batch: RolloutBatch
    examples: list[Example]  # one per row: each prompt group_size times, group after group
    rewards: torch.Tensor  # (B,) fp32
    grade_metrics: dict[str, float]  # Grades.metrics: per-grader scores, errors, timeouts
    elapsed: float  # seconds of generation (grading excluded)


class TrainingRun:
    """One run of a `TrainConfig` into `out_dir`: what it holds between steps, its loop and its
    step. With a data-parallel `world` every rank holds one, with the same config and out_dir
    (`core.training.trainer.train` says what each rank does)."""

    last_rollout: StepRollout | None = None  # the latest step's rollout, for `samples`

    def __init__(
        self,
        cfg: TrainConfig,
        out_dir: Path,
        callback: TrainerCallback,
        data_roots: Sequence[str] | None = None,
        file_paths: Mapping[str, Path] | None = None,
        model_dir: Path | None = None,
        world: World | None = None,
        grader_options: GraderOptions | None = None,
    ) -> None:
        self.world = world or World()
        check_world(cfg, self.world)
        self.cfg = cfg
        # steering (`core.training.steering`): the config the run started with, and the cumulative
        # change applied to it (version 0: none); checkpointed, so a resumed run keeps it
        self.start_cfg = cfg
        self.config_version = 0
        self.overrides: dict[str, Any] = {}
        self.out_dir = out_dir
        self.cb = callback
        self.stop = Stop(callback, self.world)
        self.phases = Phases(callback)  # what the run is doing, for the caller to show
        self.phases.enter("loading model")

        self.device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        self.lm: CausalLM = load_model(
            cfg.model, self.device, data_roots=data_roots, model_dir=model_dir
        )
        # the KL penalty's reference: the model as loaded, before the warm-up or a checkpoint
        # touch it, so a resumed run rebuilds the same one (nothing of it is checkpointed)
        self.reference = ReferencePolicy(self.lm) if cfg.algorithm.kl_beta > 0 else None
        self.silence = SilenceWatch(cfg.silent_steps, jsonl_task=cfg.task.name == "jsonl")
        self.task: Task = (
            EnvironmentTask(cfg.task)
            if cfg.task.name == "environment"
            else make_task(
                cfg.task, data_roots, file_paths, seed=cfg.seed, grader_options=grader_options
            )
        )
        dataset = getattr(self.task, "examples", ())  # a JSONL task's training records
        check_chat_prompts(self.lm.tokenizer, [*dataset, *self.task.held_out()])
        if isinstance(self.task, EnvironmentTask):
            ChatDelta(self.lm.tokenizer)  # observations need a chat template: refused here
        # FSDP2 over the ranks (`core.parallel.sharding`): before the optimizer, which holds the
        # shards
        self.sharded = cfg.sharding == "fsdp" and self.world.parallel
        if self.sharded:
            shard(self.lm)
        params = [p for _, p in self.lm.trainable()]
        self.optimizer = build_optimizer(params, cfg.optim, self.device)
        # the supervised warm-up's progress (`core.training.warmup`)
        self.warm = Warmup(cfg, self.lm)
        self.prompt_rng = random.Random(cfg.seed)
        self.sample_gen = torch.Generator(device=self.device).manual_seed(cfg.seed + 1)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed + 2)
        rollout_dtype = _DTYPES[cfg.rollout.dtype]
        # a vLLM engine holds its own copy in its own dtype: no second HF model
        self.engine = (
            _vllm_engine(self.lm, cfg, self.world) if cfg.rollout.engine == "vllm" else None
        )
        # async: the rollout server holds its own copy (`core.rollout.server`), started at the
        # first step (after a warm-up or a resume)
        self.asynchronous = cfg.rollout.mode == "async"
        self.server: RolloutServer | None = None
        self.data_roots, self.model_dir = data_roots, model_dir
        self.separate_rollout = (
            self.engine is None
            and not self.asynchronous
            and (cfg.rollout.staleness > 0 or rollout_dtype != self.lm.dtype)
        )
        self.rollout_lm = self.lm.copy_as(rollout_dtype) if self.separate_rollout else self.lm
        # snapshots[0] is the policy the next rollout samples from (staleness steps old)
        self.snapshots: deque[dict[str, torch.Tensor]] = deque(maxlen=cfg.rollout.staleness + 1)
        self.step = 0
        self.saved_step = -1  # the step of this run's latest checkpoint (-1: none yet)
        # rank 0 writes the files (every rank holds a replica): metrics here, evaluations and
        # samples through `results`
        self.writer = self.world.rank == 0
        self.metrics_path = out_dir / "metrics.jsonl"
        self.results = RunResults(self._results_cfg(), out_dir, self.task, self.lm, callback)

    # -- the run: start or resume, the step loop, the final save ------------------------

    def train(self, resume: bool = False, tracking: TrackingOptions | None = None) -> TrainResult:
        """The whole run (`resume`: from the latest checkpoint in `out_dir`, if there is
        one); `tracking`: the trackers rank 0 reports to (`core.training.reporting`)."""
        self._start(resume, tracking)
        stopped = self._warm_up() or self._evaluate_if_owed() or self._train_run()
        if stopped is not None:
            return stopped
        return self._save_final()

    def _start(self, resume: bool, tracking: TrackingOptions | None) -> None:
        """Resume from the latest checkpoint, or start afresh; then the trackers, and a fresh
        run's config change made while the job was queued (it applies from the start)."""
        ckpt = latest_checkpoint(self.out_dir) if resume else None
        if ckpt is not None:
            self._resume_from(ckpt)
        elif self.writer:
            # a fresh run owns its output dir: stale checkpoints would poison a later resume
            shutil.rmtree(self.out_dir / "checkpoints", ignore_errors=True)
            discard_dir(self.out_dir / "final")
            self.metrics_path.write_text("")
            self.results.reset()
        if tracking is not None and isinstance(self.cb, ReportingCallback):
            # a resumed run continues its tracker runs (from its checkpoint, or from the start)
            resume_step = self.step if ckpt is not None else (0 if resume else None)
            reporter = Reporter(tracking, self.out_dir, resume_step=resume_step)
            backfill = self.out_dir if ckpt is not None and self.writer else None
            self.cb.attach(reporter, self.start_cfg, backfill)
        if ckpt is None:
            self._steer()

    def _resume_from(self, ckpt: Path) -> None:
        # stopped during the warm-up: the checkpoint holds the warm-up's optimizer
        warming = warmup_unfinished(ckpt)
        self.step, state = load_checkpoint(
            ckpt, self.lm, self.warm.optimizer if warming else self.optimizer
        )
        for group in self.optimizer.param_groups:
            group.update(adamw_kernel(self.device))
        self.restore(state)
        self.results.cfg = self._results_cfg()  # the steered config the checkpoint ran with
        if self.writer:
            _truncate_metrics(self.metrics_path, self.step)
            self.results.resume(self.step)
        # a checkpoint stopped during the warm-up is no step's: step 0 is saved again after it
        if self.warm.finished:
            self.saved_step = self.step
        w = self.warm
        where = f"after warm-up step {w.done}/{w.total}" if warming else f"at step {self.step}"
        self.cb.on_log(f"resumed from {ckpt} {where}")

    def _warm_up(self) -> TrainResult | None:
        """A fresh run's warm-up, or the rest of a stopped one's; a stop during it ends the run
        with the warm-up steps done checkpointed."""
        if self.warmup():
            return None
        done, total = self.warm.done, self.warm.total
        self.cb.on_log(
            f"stopped during the warm-up after step {done}/{total}; checkpointed: a resumed run "
            f"continues the warm-up at step {done + 1}/{total}"
        )
        return TrainResult(step=0, stopped=True, final_model=None)

    def _train_run(self) -> TrainResult | None:
        """The step loop, until the last step (None) or a stop (its result): a change of the
        config and a stop are taken at the boundary before each step; after it its metrics,
        the evaluation due and the checkpoint due. (tests/core/test_stop_keeps_work.py finds
        the boundary's stop question by this method's name.)"""
        with self._metrics_file() as metrics_file:
            while self._steer() and self.step < self.cfg.steps:
                if self.stop.at_boundary():
                    return self._stopped_at_boundary()
                self.phases.enter("training", self.step, self.cfg.steps)
                try:
                    metrics = self.run_step()
                except StopRequested as stop:
                    return self._stopped_in_step(stop)
                self._report(metrics, metrics_file)
                stopped = self._evaluate_if_owed()
                if stopped is not None:
                    return stopped
                every = self.cfg.checkpoint_every
                if (every and self.step % every == 0) or self.step == self.cfg.steps:
                    self.checkpoint()
        return None

    def _save_final(self) -> TrainResult:
        """The final model under out_dir/final (gathered on rank 0 first when sharded), and
        what the run learned nothing from."""
        final = self.out_dir / "final"
        self.phases.enter("saving")
        if self.sharded:  # gathered on rank 0, by every rank
            state = full_state(self.lm.module)
            if self.writer:
                write_dir_atomically(
                    final,
                    lambda tmp: self.lm.save_final_state(tmp, state),
                    _tensor_bytes(state.values()),
                )
        elif self.writer:
            weights = self.lm.module.state_dict().values()
            write_dir_atomically(
                final,
                lambda tmp: self.lm.save_final(tmp, merged=self.cfg.save_merged),
                _tensor_bytes(weights),
            )
        warnings: list[RunWarning] = []
        if self.writer:
            self.cb.on_log(f"final model saved to {final}")
            metrics, evals = _jsonl_rows(self.metrics_path), _jsonl_rows(self.results.eval_path)
            warnings = run_warnings(metrics, evals)
            for w in warnings:
                self.cb.on_warning(f"run finished with a warning ({w.code}): {w.message}")
        return TrainResult(step=self.step, stopped=False, final_model=final, warnings=warnings)

    # -- stops --------------------------------------------------------------------------

    def _stopped_at_boundary(self) -> TrainResult:
        """Stopped between steps: the last step is checkpointed (a stop heard between the
        last step's minibatches let that step finish: it holds)."""
        if self.saved_step != self.step:
            self.checkpoint()
        if self.stop.heard:
            self.cb.on_log(
                f"stopped between minibatch updates of step {self.step}; finished the step "
                f"first and checkpointed it: a resumed run goes on at step {self.step + 1}"
            )
        else:
            self.cb.on_log(f"stopped at step {self.step}")
        return TrainResult(step=self.step, stopped=True, final_model=None)

    def _stopped_in_step(self, stop: StopRequested) -> TrainResult:
        """Stopped inside a step: rewound to the last one and checkpointed, or, when its update
        had begun (a stop that keeps no work), discarded with the latest checkpoint kept."""
        if self.stop.partial:
            kept = (
                f"the latest checkpoint (step {self.saved_step}) is kept"
                if self.saved_step >= 0
                else "there is no checkpoint yet"
            )
            self.cb.on_log(
                f"{stop} of step {self.step + 1}; its partial update is discarded; {kept}"
            )
            return TrainResult(step=self.step, stopped=True, final_model=None)
        if self.saved_step != self.step:
            self.checkpoint()
        self.cb.on_log(f"{stop} of step {self.step + 1}; stopped at step {self.step}")
        return TrainResult(step=self.step, stopped=True, final_model=None)

    # -- one RL step --------------------------------------------------------------------

    def run_step(self) -> dict[str, float]:
        """One step: rollout, group advantages, the update, the step's metrics. A
        `StopRequested` from inside leaves the run as after the last step (rewound), or, when
        an update had begun, with `stop.partial` set."""
        t0 = time.perf_counter()
        mark = self._mark()
        try:
            ro = self.rollout()
        except StopRequested:
            self._rewind(mark)
            raise
        group_size = self.cfg.rollout.group_size
        adv = group_advantages(ro.rewards, group_size, self.cfg.algorithm.normalize_std)
        lr = lr_at(self.step, self.cfg.optim, self.cfg.steps)  # a function of the step alone
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        t1 = time.perf_counter()
        try:
            update_metrics = self.update(ro.batch, adv)
        except StopRequested:
            if not self.stop.partial:
                self._rewind(mark)
            raise
        _sync(self.device)
        update_time = time.perf_counter() - t1
        self.step += 1
        # the new policy to the rollout server, which samples on while the step is reported
        sync = self._publish() if self.server is not None else {}
        self.stop.partial = False
        self.last_rollout = StepRollout(ro.examples, ro.batch.completions, ro.rewards.tolist())
        return {
            "step": float(self.step),
            **self._rollout_metrics(ro),
            **sync,
            **update_metrics,
            **self._memory_metrics(),
            "lr": lr,
            "delta_low": self.cfg.algorithm.delta_low,
            "delta_high": self.cfg.algorithm.delta_high,
            "update_time": update_time,
            "step_time": time.perf_counter() - t0,
        }

    def rollout(self) -> _Rollout:
        """Sample the step's groups and grade them (`Task.grade`: one call for the batch, so
        graders that run code or call out can batch, time out and report metrics); an
        environment's episodes are scored by the environment itself."""
        r = self.cfg.rollout
        if self.asynchronous:
            exs, batch, elapsed, extra = self._server_rollout()
        else:
            exs = self._draw_prompts()
            if isinstance(self.task, EnvironmentTask):
                return self._episodes(self.task, [e for e in exs for _ in range(r.group_size)])
            batch, elapsed, extra = self._local_rollout(exs)
        group = [e for e in exs for _ in range(r.group_size)]
        tok = self.lm.tokenizer
        grades = self.task.grade(group, [tok.decode(c) for c in batch.completions])
        rewards = torch.tensor(grades.rewards, dtype=torch.float32)  # (B,)
        return _Rollout(batch, group, rewards, {**grades.metrics, **extra}, elapsed)

    def _draw_prompts(self) -> list[Example]:
        """The step's prompts for a rollout in this process, and the rollout copy's weights
        (`staleness` steps old) and, across ranks, this rank's share of them."""
        r = self.cfg.rollout
        if self.separate_rollout:
            self.snapshots.append(self.lm.snapshot())
            self.rollout_lm.load_snapshot(self.snapshots[0])
        exs = [self.task.sample(self.prompt_rng) for _ in range(r.prompts_per_step)]
        if self.world.parallel:  # every rank draws the step's prompts, and keeps its share
            exs = exs[self.world.share(len(exs))]
            self.sample_gen.manual_seed(self.world.seed(self.cfg.seed, self.step))
        return exs

    def _local_rollout(self, exs: list[Example]) -> tuple[RolloutBatch, float, dict[str, float]]:
        """`exs` sampled in this process (or its vLLM engine): the batch, the seconds of
        sampling and the engine's metrics."""
        r = self.cfg.rollout
        tok = self.lm.tokenizer
        # each drawn prompt tokenized once (chat records through the chat template), its ids
        # shared by the rows of its group; `generate` prefills each distinct prompt once
        ids = [encode_example(tok, e) for e in exs]
        extra: dict[str, float] = {}
        if self.engine is not None:
            batch, elapsed, extra["weight_sync_time"] = self._engine_sample(self.engine, ids)
        else:
            t0 = time.perf_counter()
            # sharded: every rank gathers the weights once, then samples without collectives
            with gathered(self.rollout_lm) if self.sharded else nullcontext():
                batch = generate(
                    self.rollout_lm,
                    [p for p in ids for _ in range(r.group_size)],
                    **asdict(SamplingOptions.of(self.cfg)),
                    generator=self.sample_gen,
                    should_stop=self.stop.in_step,
                )
            _sync(self.device)
            elapsed = time.perf_counter() - t0
        return batch, elapsed, extra

    def _server_rollout(self) -> tuple[list[Example], RolloutBatch, float, dict[str, float]]:
        """The step's batch from the rollout server (`core.rollout.server`): first the prompts
        of the steps up to `max_off_policy_steps` ahead are asked for (drawn in the order the
        sync loop draws them), then the oldest finished batch young enough is taken; the
        examples, the batch, the server's seconds of sampling and the async metrics."""
        server = self.server or self._start_server()
        r = self.cfg.rollout
        tok = self.lm.tokenizer
        last = min(self.step + r.max_off_policy_steps, self.cfg.steps - 1)
        while server.requested_through < last:
            drawn_at = self.prompt_rng.getstate()
            exs = [self.task.sample(self.prompt_rng) for _ in range(r.prompts_per_step)]
            ids = [encode_example(tok, e) for e in exs]
            target = server.requested_through + 1
            server.submit(ids, target, Sampling.of(self.cfg), tag=(exs, drawn_at))
        taken = server.take(self.step, should_stop=self.stop.in_step)
        done = taken.finished
        if self.device.type == "cpu":  # what a checkpoint resumes the sampling from
            self.sample_gen.set_state(done.generator_state)
        exs, _ = done.tag
        return exs, done.batch, done.seconds, taken.metrics

    def _start_server(self) -> RolloutServer:
        """The rollout server, sampling from where this run's sampling generator is (a CPU
        generator: on a GPU run, seeded like the sync loop's)."""
        gen = self.sample_gen
        if self.device.type != "cpu":
            gen = torch.Generator().manual_seed(self.cfg.seed + 1)
        self.server = RolloutServer(
            self.cfg,
            generator_state=gen.get_state(),
            data_roots=self.data_roots,
            model_dir=self.model_dir,
            device=self.device,
            on_log=self.cb.on_log,
        )
        self.server.requested_through = self.step - 1
        self._publish()  # starts it
        return self.server

    def _publish(self) -> dict[str, float]:
        """The trained weights (the adapter's alone with LoRA) to the rollout server."""
        assert self.server is not None
        weights = {n: p.detach() for n, p in self.lm.trainable()}
        return self.server.publish(weights, version=self.step)

    def close(self) -> None:
        """Stop what the run started beside itself (the rollout server): after it ends,
        fails or stops."""
        server, self.server = self.server, None
        if server is not None:
            server.close()

    def _episodes(self, task: EnvironmentTask, group: list[Example]) -> _Rollout:
        """The step's groups as multi-turn episodes (`core.rollout.episodes`): each row an
        episode of its group's task row, its reward the environment's."""
        t0 = time.perf_counter()
        with gathered(self.rollout_lm) if self.sharded else nullcontext():
            played = run_episodes(
                self.rollout_lm,
                task.environment,
                group,
                limits=task.limits,
                sampling=SamplingOptions.of(self.cfg),
                generator=self.sample_gen,
                should_stop=self.stop.in_step,
            )
        _sync(self.device)
        rewards = torch.tensor(played.rewards, dtype=torch.float32)
        return _Rollout(played.batch, group, rewards, played.metrics, time.perf_counter() - t0)

    def update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """The step's optimizer updates (`core.training.update`), asking the stop between
        minibatches (`Stop.between_minibatches`)."""
        return update_policy(
            self.lm,
            self.optimizer,
            batch,
            advantages,
            self.cfg,
            shuffle_gen=self.shuffle_gen,
            reference=self.reference,
            should_stop=self.stop.between_minibatches,
            before_step=self.stop.update_begins,
            world=self.world,
        )

    def _rollout_metrics(self, ro: _Rollout) -> dict[str, float]:
        """The rollout's rewards, grades and throughput over the whole batch; told to the
        silence watch, which warns when the run learns nothing."""
        group_size = self.cfg.rollout.group_size
        zero_adv = zero_adv_groups(ro.rewards, group_size)
        stats = _batch_stats(self.world, ro, zero_adv, group_size)
        seen = ro.rewards
        if self.world.parallel:  # the watch reads the extremes: the whole batch's, every rank's
            low = -self.world.max(-float(ro.rewards.min()))
            seen = torch.tensor([low, self.world.max(float(ro.rewards.max()))])
        warning = self.silence.observe(seen, stats["zero_adv_groups"])
        if warning is not None:
            self.cb.on_warning(warning)
        return stats

    def _memory_metrics(self) -> dict[str, float]:
        if self.device.type != "cuda":
            return {}
        return {"gpu_mem_peak_gb": torch.cuda.max_memory_allocated(self.device) / 2**30}

    def _report(self, metrics: dict[str, float], metrics_file: IO[str] | None) -> None:
        """The step's metrics to metrics.jsonl (rank 0) and the caller, then its samples."""
        _check_finite(metrics)
        if metrics_file is not None:
            metrics_file.write(json.dumps(metrics) + "\n")
            metrics_file.flush()
        self.cb.on_step(self.step, metrics)
        self.results.after_step(self.step, self.last_rollout)

    # -- the rollout engine -------------------------------------------------------------

    def _engine_sample(
        self, engine: VLLMEngine, ids: list[list[int]]
    ) -> tuple[RolloutBatch, float, float]:
        """The step's groups from the vLLM engine, after loading into it the policy to sample
        from: the current weights, or with `staleness` the snapshot that many steps old. Its
        seeds come from the run's sampling generator, so a resumed run draws the same ones.
        Returns the batch, the seconds of sampling and the seconds of the weight sync."""
        r = self.cfg.rollout
        stale = None
        if r.staleness > 0:
            self.snapshots.append(self.lm.snapshot())
            stale = self.snapshots[0]
        # sharded: every rank gathers the weights for its own engine (a collective: all enter)
        with gathered(self.lm) if self.sharded else nullcontext():
            sync_time = engine.load_weights(self._engine_weights(stale))
        seed = int(torch.randint(0, 2**31, (1,), generator=self.sample_gen, device=self.device))
        tok = self.lm.tokenizer
        t0 = time.perf_counter()
        batch = engine.sample(
            ids,
            group_size=r.group_size,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=self.cfg.algorithm.top_k,
            seed=seed,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            device=self.device,
            should_stop=self.stop.in_step,
        )
        return batch, time.perf_counter() - t0, sync_time

    def _engine_weights(self, stale: dict[str, torch.Tensor] | None) -> list[tuple[str, Any]]:
        """The whole policy for the engine (`CausalLM.inference_weights`: LoRA merged in), or
        with a `stale` snapshot (trainable weights only) the policy it holds: the engine needs
        every weight at once (a partial reload of a fused layer, q and v without k, leaves it
        NaN), so the frozen ones come from the model, unchanged since the run began."""
        lm = self.lm
        if stale is None:
            return lm.inference_weights()
        if lm.has_adapters:
            now = lm.snapshot()
            lm.load_snapshot(stale)
            try:
                return lm.inference_weights()  # the adapted weights merged anew: not views
            finally:
                lm.load_snapshot(now)
        return list({**dict(lm.inference_weights()), **stale}.items())

    # -- evaluations, steering ----------------------------------------------------------

    def _evaluate_if_owed(self) -> TrainResult | None:
        """The held-out evaluation due after `step`, if not done yet (a run stopped during one
        was checkpointed without it: it is owed on resume). A stop during it ends the run with
        the step checkpointed and its evaluation undone: the resumed run evaluates that step
        first, with the same generator seed, so the numbers are the ones it would have had."""
        if self.results.owes(self.step):
            self.phases.enter("evaluating")
        try:
            with self._gathered_for_eval():
                self.results.evaluate_if_owed(self.step)
        except StopRequested as stop:
            if self.saved_step != self.step:
                self.checkpoint()
            self.cb.on_log(
                f"{stop} of step {self.step}; stopped at step {self.step} (evaluated on resume)"
            )
            return TrainResult(step=self.step, stopped=True, final_model=None)
        return None

    def _gathered_for_eval(self) -> AbstractContextManager[None]:
        """A sharded run's weights gathered on every rank when an evaluation may be due at this
        step (rank 0 alone evaluates, and its forwards must call no collective:
        `core.parallel.sharding`)."""
        cfg, step = self.cfg, self.step
        every = cfg.eval_every
        due = bool(every) and (
            (step == 0 and cfg.eval_on_start)
            or (step > 0 and (step % every == 0 or step == cfg.steps))
        )
        return gathered(self.lm) if self.sharded and due else nullcontext()

    def _steer(self) -> bool:
        """Apply the caller's newest config change, if any, at this step boundary (always True,
        to sit in the loop's condition). A change that does not validate is reported and
        skipped. The results follow the new step count (the last step's evaluation and
        samples)."""
        update = self.world.from_rank0(self.cb.config_update())  # rank 0's callback hears it
        if update is None or update[0] <= self.config_version:
            return True
        version, overrides = update
        try:
            changes = self.steer(version, overrides)
        except ValueError as exc:
            self.config_version = version  # not asked again
            self.cb.on_warning(f"config change {version} not applied: {exc}")
            return True
        self.results.cfg = self._results_cfg()
        self.cb.on_config(self.step, version, changes)
        return True

    def steer(self, version: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """Run with the start config changed by `overrides` from now on (the loss, the mask,
        the sampler and the schedule read `self.cfg` at every step); returns what changed.
        Raises pydantic's ValidationError for a change that does not validate."""
        cfg = steered(self.start_cfg, overrides)
        changes = changed(self.cfg, cfg)
        self.cfg, self.config_version, self.overrides = cfg, version, overrides
        return changes

    def _results_cfg(self) -> TrainConfig:
        """What the run's results follow: its config on rank 0; on the other ranks, none of the
        evaluations or samples (rank 0 writes and reports those)."""
        if self.writer:
            return self.cfg
        return self.cfg.model_copy(update={"eval_every": 0, "log_samples_every": 0})

    def _metrics_file(self) -> AbstractContextManager[IO[str] | None]:
        return self.metrics_path.open("a", encoding="utf-8") if self.writer else nullcontext()

    # -- state and checkpoints ----------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "prompt_rng": self._prompt_state(),
            "sample_gen": self.sample_gen.get_state(),
            "shuffle_gen": self.shuffle_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "snapshots": [{k: v.cpu() for k, v in s.items()} for s in self.snapshots],
            "silence": self.silence.state(),
            "steering": {"version": self.config_version, "overrides": self.overrides},
            "warmup": self.warm.state(),
        }

    def _prompt_state(self) -> Any:
        """The prompt generator to resume from: async, as it was before the draw of the oldest
        prompts asked for and not trained on (the resumed run asks for them again)."""
        if self.server is not None:
            in_flight = [tag[1] for tag in self.server.in_flight()]
            if in_flight:
                return in_flight[0]
        return self.prompt_rng.getstate()

    def restore(self, state: dict[str, Any]) -> None:
        self.prompt_rng.setstate(_as_random_state(state["prompt_rng"]))
        self.sample_gen.set_state(state["sample_gen"])
        self.shuffle_gen.set_state(state["shuffle_gen"])
        torch.set_rng_state(state["torch_rng"])
        self.snapshots.clear()
        for s in state["snapshots"]:
            self.snapshots.append({k: v.to(self.device) for k, v in s.items()})
        self.silence.restore(state.get("silence"))
        self.warm.restore(state.get("warmup"))
        steering = state.get("steering")
        if steering and steering["version"] > 0:
            self.steer(steering["version"], steering["overrides"])

    def _mark(self) -> tuple[Any, ...]:
        """What a step consumes before its first update (RNG draws, a rollout snapshot): enough
        to rewind a step stopped during its rollout, so its checkpoint equals the last step's."""
        return (
            self.prompt_rng.getstate(),
            self.sample_gen.get_state(),
            self.shuffle_gen.get_state(),
            torch.get_rng_state(),
            list(self.snapshots),
        )

    def _rewind(self, mark: tuple[Any, ...]) -> None:
        prompt, sample, shuffle, torch_rng, snapshots = mark
        self.prompt_rng.setstate(prompt)
        self.sample_gen.set_state(sample)
        self.shuffle_gen.set_state(shuffle)
        torch.set_rng_state(torch_rng)
        self.snapshots.clear()
        self.snapshots.extend(snapshots)

    def checkpoint(self) -> Path | None:
        """The run's checkpoint: rank 0's alone (the other ranks hold the same replica), or,
        sharded, every rank's shard; the folder on rank 0, None on the others. Stopped during
        the warm-up, it is step 0's with the warm-up's optimizer in the RL optimizer's place
        (`core.training.checkpoint.warmup_unfinished`), and meta.json's `warmup` says how far it
        got."""
        meta: dict[str, Any] = {
            "config": self.cfg.model_dump(mode="json"),
            "model": self.cfg.model.name,
            "config_version": self.config_version,
        }
        if self.warm.total:
            meta["warmup"] = {"done": self.warm.done, "total": self.warm.total}
        self.phases.enter("saving")
        self.saved_step = self.step
        if not self.sharded and self.world.rank != 0:
            return None
        # sharded, every rank writes its shard (and the folder is rank 0's to return)
        save = save_sharded_checkpoint if self.sharded else save_checkpoint
        path = save(
            self.out_dir,
            self.step,
            self.lm,
            self.warm.optimizer if not self.warm.finished else self.optimizer,
            state=self.state(),
            meta=meta,
            keep=self.cfg.keep_checkpoints,
        )
        if path is not None:
            self.cb.on_checkpoint(self.step, path)
        return path

    # -- warm-up ------------------------------------------------------------------------

    def warmup(self) -> bool:
        """The rest of the supervised warm-up the task asks for (`core.training.warmup`); False if
        stopped midway (with several ranks, all of them, at the same warm-up step: they agree
        on a stop), checkpointed then, so that a resumed run goes on from that step."""
        if self.warm.finished:
            return True
        if self.warm.run(
            self.cfg, self.lm, self.task, self.cb, self.device, should_stop=self.stop.at_boundary
        ):
            return True
        self.checkpoint()
        return False


def _batch_stats(world: World, ro: _Rollout, zero_adv: float, group_size: int) -> dict[str, float]:
    """The rollout's rewards, grades and throughput, over the whole batch: with several ranks
    the sums of every rank's share (grades are per-rank means of equal shares, so their mean),
    the slowest rank's sampling time."""
    rewards = ro.rewards
    n_tokens = float(ro.batch.response_mask.sum())
    rows = float(len(rewards))
    groups = rows / group_size
    grade_names = sorted(ro.grade_metrics)
    r_sum, r_sq, rows, zero, n_tokens, *grades = world.sums(
        [
            float(rewards.sum()),
            float((rewards.double() ** 2).sum()),
            rows,
            zero_adv * groups,
            n_tokens,
            *(ro.grade_metrics[k] for k in grade_names),
        ]
    )
    elapsed = world.max(ro.elapsed)
    if world.parallel:
        mean = r_sum / rows
        std = math.sqrt(max(r_sq - rows * mean * mean, 0.0) / max(rows - 1, 1.0))
        grade_metrics = {k: v / world.size for k, v in zip(grade_names, grades, strict=True)}
        zero_adv = zero / (rows / group_size)
    else:  # bit for bit what one process always reported
        mean, std, grade_metrics = float(rewards.mean()), float(rewards.std()), ro.grade_metrics
    return {
        "reward_mean": mean,
        "reward_std": std,
        **grade_metrics,
        "zero_adv_groups": zero_adv,
        "response_len": n_tokens / rows,
        "tokens_per_s": n_tokens / max(elapsed, 1e-9),
        "rollout_time": elapsed,
    }


def _vllm_engine(lm: CausalLM, cfg: TrainConfig, world: World) -> VLLMEngine:
    """The vLLM engine for `lm`, loading what it was loaded from (`HFLM.source`)."""
    from core.rollout.vllm_engine import VLLMEngine, vllm_available

    source = getattr(lm, "source", None)
    if source is None:
        raise ValueError("rollout.engine='vllm' needs a Hugging Face model")
    if not vllm_available():
        raise RuntimeError(
            "rollout.engine='vllm' needs vLLM in the worker: pip install 'pdppo[vllm]'"
        )
    return VLLMEngine(source, cfg, lm.max_seq_len, world)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _as_random_state(state: Any) -> tuple[Any, ...]:
    """random.Random states come back from torch.load as lists; setstate needs tuples."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


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


def _tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """What the final model's weights take on disk, about (a LoRA model's merged ones less):
    checked free before its save, so a full disk refuses it whole rather than midway."""
    return sum(t.numel() * t.element_size() for t in tensors)
