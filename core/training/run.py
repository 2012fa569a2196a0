"""One run's state between steps and one RL step: the model, its optimizer, the rollout copy or
vLLM engine, the generators, the steering (`core.training.steering`), and checkpointing all of it.

`core.training.trainer` drives it: the loop, stops, evaluations and what a resumed run owes. Kept
apart so that each module reads in one sitting; `core.training.trainer` re-exports what callers used
from it.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from core.config import TrainConfig
from core.graders import GraderOptions
from core.models import CausalLM, load_model
from core.models.base import check_chat_prompts, encode_example
from core.parallel.distributed import World, check_world
from core.parallel.sharding import gathered, shard
from core.rollout import RolloutBatch, StopRequested, generate
from core.tasks import Example, Task, make_task
from core.training.callbacks import Phases, TrainerCallback
from core.training.checkpoint import save_checkpoint, save_sharded_checkpoint
from core.training.devices import build_optimizer, resolve_device
from core.training.evaluation import StepRollout
from core.training.reference import ReferencePolicy
from core.training.schedule import lr_at
from core.training.silence import SilenceWatch, zero_adv_groups
from core.training.steering import changed, steered
from core.training.update import group_advantages, update_policy
from core.training.warmup import Warmup

if TYPE_CHECKING:
    from core.rollout.vllm_engine import VLLMEngine

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class _Rollout:
    """One step's sampled batch and its grades."""

    batch: RolloutBatch
    examples: list[Example]  # one per row: each prompt group_size times, group after group
    rewards: torch.Tensor  # (B,) fp32
    grade_metrics: dict[str, float]  # Grades.metrics: per-grader scores, errors, timeouts
    elapsed: float  # seconds of generation (grading excluded)


class _Run:
    """Everything a run holds between steps; checkpointed and restored as a whole."""

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
        self.phases = Phases(callback)  # what the run is doing, for the caller to show
        self.phases.enter("loading model")
        # asked inside a step (every token, every minibatch); ranks must stop together, so with
        # several a stop waits for the step boundary, where they agree on it (core.training.trainer)
        self.inner_stop = callback.should_stop if not self.world.parallel else self._heard

        self.device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        self.lm: CausalLM = load_model(
            cfg.model, self.device, data_roots=data_roots, model_dir=model_dir
        )
        # the KL penalty's reference: the model as loaded, before the warm-up or a checkpoint
        # touch it, so a resumed run rebuilds the same one (nothing of it is checkpointed)
        self.reference = ReferencePolicy(self.lm) if cfg.algorithm.kl_beta > 0 else None
        self.silence = SilenceWatch(cfg.silent_steps, jsonl_task=cfg.task.name == "jsonl")
        self.task: Task = make_task(
            cfg.task, data_roots, file_paths, seed=cfg.seed, grader_options=grader_options
        )
        dataset = getattr(self.task, "examples", ())  # a JSONL task's training records
        check_chat_prompts(self.lm.tokenizer, [*dataset, *self.task.held_out()])
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
        self.separate_rollout = self.engine is None and (
            cfg.rollout.staleness > 0 or rollout_dtype != self.lm.dtype
        )
        self.rollout_lm = self.lm.copy_as(rollout_dtype) if self.separate_rollout else self.lm
        # snapshots[0] is the policy the next rollout samples from (staleness steps old)
        self.snapshots: deque[dict[str, torch.Tensor]] = deque(maxlen=cfg.rollout.staleness + 1)
        self.step = 0
        self.dirty = False  # the weights hold part of an unfinished step's update
        self.stop_heard = False  # a stop came between minibatches; the step finished first

    def _heard(self) -> bool:
        """Inside a step of a data-parallel run: the callback is still asked, so that it hears
        a stop at once (a service's job tells its worker that a checkpoint is coming, and is not
        killed for taking until the step's end), but the stop waits for the step boundary."""
        self.cb.should_stop()
        return False

    # -- state --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "prompt_rng": self.prompt_rng.getstate(),
            "sample_gen": self.sample_gen.get_state(),
            "shuffle_gen": self.shuffle_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "snapshots": [{k: v.cpu() for k, v in s.items()} for s in self.snapshots],
            "silence": self.silence.state(),
            "steering": {"version": self.config_version, "overrides": self.overrides},
            "warmup": self.warm.state(),
        }

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

    def steer(self, version: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """Run with the start config changed by `overrides` from now on (the loss, the mask,
        the sampler and the schedule read `self.cfg` at every step); returns what changed.
        Raises pydantic's ValidationError for a change that does not validate."""
        cfg = steered(self.start_cfg, overrides)
        changes = changed(self.cfg, cfg)
        self.cfg, self.config_version, self.overrides = cfg, version, overrides
        return changes

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
        if not self.sharded and self.world.rank != 0:
            return None
        # sharded, every rank writes its shard (and the folder is rank 0's to return)
        save = save_sharded_checkpoint if self.sharded else save_checkpoint
        path = save(
            self.out_dir,
            self.step,
            self.lm,
            self.warm.optimizer if not self.warm.finished else self.optimizer,
            self.state(),
            meta,
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
            self.cfg,
            self.lm,
            self.task,
            self.cb,
            self.device,
            should_stop=lambda: self.world.agree(self.cb.should_stop()),
        ):
            return True
        self.checkpoint()
        return False

    # -- one RL step --------------------------------------------------------------------

    def rollout(self) -> _Rollout:
        """Sample the step's groups and grade them (`Task.grade`: one call for the batch, so
        graders that run code or call out can batch, time out and report metrics)."""
        r = self.cfg.rollout
        if self.separate_rollout:
            self.snapshots.append(self.lm.snapshot())
            self.rollout_lm.load_snapshot(self.snapshots[0])
        exs = [self.task.sample(self.prompt_rng) for _ in range(r.prompts_per_step)]
        if self.world.parallel:  # every rank draws the step's prompts, and keeps its share
            exs = exs[self.world.share(len(exs))]
            self.sample_gen.manual_seed(self.world.seed(self.cfg.seed, self.step))
        group = [e for e in exs for _ in range(r.group_size)]
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
                    max_new_tokens=r.max_new_tokens,
                    temperature=r.temperature,
                    top_p=r.top_p,
                    top_k=self.cfg.algorithm.top_k,
                    keep_full=self.cfg.algorithm.estimator == "exact",
                    generator=self.sample_gen,
                    should_stop=self.inner_stop,
                )
            _sync(self.device)
            elapsed = time.perf_counter() - t0
        grades = self.task.grade(group, [tok.decode(c) for c in batch.completions])
        rewards = torch.tensor(grades.rewards, dtype=torch.float32)  # (B,)
        return _Rollout(batch, group, rewards, {**grades.metrics, **extra}, elapsed)

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
            should_stop=self.inner_stop,
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

    def update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """The step's optimizer updates (`core.training.update`); `dirty` from the first one on. A
        stop heard between minibatches that keeps the work (`TrainerCallback.stop_keeps_work`)
        lets the step finish, and the loop checkpoints it at the step boundary, where the stop
        is asked again; one that does not raises `StopRequested` at once."""

        def dirty() -> None:
            self.dirty = True

        def stop_now() -> bool:
            if not self.inner_stop():
                return False
            if self.cb.stop_keeps_work():
                self.stop_heard = True  # the loop says so when it stops at the step's end
                return False
            return True

        return update_policy(
            self.lm,
            self.optimizer,
            batch,
            advantages,
            self.cfg,
            shuffle_gen=self.shuffle_gen,
            reference=self.reference,
            should_stop=stop_now,
            before_step=dirty,
            world=self.world,
        )

    def run_step(self) -> dict[str, float]:
        """One step; a `StopRequested` from inside leaves the run as after the last step, or
        `dirty` when an update had already begun."""
        t0 = time.perf_counter()
        mark = self._mark()
        try:
            ro = self.rollout()
        except StopRequested:
            self._rewind(mark)
            raise
        batch, rewards = ro.batch, ro.rewards
        group_size = self.cfg.rollout.group_size
        adv = group_advantages(rewards, group_size, self.cfg.algorithm.normalize_std)
        lr = lr_at(self.step, self.cfg.optim, self.cfg.steps)  # a function of the step alone
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        t1 = time.perf_counter()
        try:
            metrics = self.update(batch, adv)
        except StopRequested:
            if not self.dirty:
                self._rewind(mark)
            raise
        _sync(self.device)
        update_time = time.perf_counter() - t1
        self.step += 1
        self.dirty = False
        self.last_rollout = StepRollout(ro.examples, batch.completions, rewards.tolist())
        zero_adv = zero_adv_groups(rewards, group_size)
        batch_stats = _batch_stats(self.world, ro, zero_adv, group_size)
        seen = rewards
        if self.world.parallel:  # the watch reads the extremes: the whole batch's, every rank's
            low, high = -self.world.max(-float(rewards.min())), self.world.max(float(rewards.max()))
            seen = torch.tensor([low, high])
        warning = self.silence.observe(seen, batch_stats["zero_adv_groups"])
        if warning is not None:
            self.cb.on_warning(warning)
        if self.device.type == "cuda":
            metrics["gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return {
            "step": float(self.step),
            **batch_stats,
            **metrics,
            "lr": lr,
            "delta_low": self.cfg.algorithm.delta_low,
            "delta_high": self.cfg.algorithm.delta_high,
            "update_time": update_time,
            "step_time": time.perf_counter() - t0,
        }


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
