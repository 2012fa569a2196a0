"""One run's bookkeeping (`core.training.run._Run`), tested on the run object itself: how old
the policy a rollout samples from is (`rollout.staleness`), what a stopped step rewinds, and the
step's batch statistics. The trainer's own runs (tests/core/test_trainer*.py) only see these
through whole runs, where a policy one step too old or too young still trains."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from core.parallel.distributed import World
from core.rollout import RolloutBatch, StopRequested, generate
from core.training.devices import resolve_device
from core.training.run import TrainingRun as _Run
from core.training.run import _as_random_state, _batch_stats, _Rollout
from tests.support.trainer_runs import Recorder, small_config


def _run(tmp_path: Path, **overrides: Any) -> _Run:
    return _Run(small_config(**overrides), tmp_path, Recorder())


def _mark_weights(run: _Run, value: float) -> None:
    """Every trainable weight of the policy set to `value`: the policy of one step, told
    apart from the others by that number."""
    with torch.no_grad():
        for _, p in run.lm.trainable():
            p.fill_(value)


def _rollout_value(run: _Run) -> float:
    """The number the rollout copy holds (one value in every trainable weight)."""
    params = dict(run.rollout_lm.module.named_parameters())
    values = {float(params[name].detach().float().flatten()[0]) for name, _ in run.lm.trainable()}
    assert len(values) == 1
    return values.pop()


@pytest.mark.parametrize("staleness", [1, 2, 3])
def test_a_rollout_samples_from_the_policy_exactly_staleness_steps_old(
    tmp_path: Path, staleness: int
) -> None:
    run = _run(tmp_path, rollout={"staleness": staleness})
    assert run.separate_rollout and run.rollout_lm is not run.lm
    seen = []
    for step in range(6):
        _mark_weights(run, float(step))  # the policy after `step` updates
        run.rollout()
        seen.append(_rollout_value(run))
    # the first steps sample from the oldest policy there is, the loaded one's first snapshot
    assert seen == [float(max(step - staleness, 0)) for step in range(6)]
    assert len(run.snapshots) == staleness + 1


def test_without_staleness_the_rollout_is_the_policy_itself(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert not run.separate_rollout and run.rollout_lm is run.lm
    run.rollout()
    assert len(run.snapshots) == 0


def test_a_low_precision_rollout_without_staleness_samples_the_current_policy(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path, rollout={"dtype": "bfloat16"})
    assert run.separate_rollout and run.rollout_lm.dtype == torch.bfloat16
    for step in range(3):
        _mark_weights(run, float(step))
        run.rollout()
        assert _rollout_value(run) == float(step)
    assert len(run.snapshots) == 1


def test_a_rewound_step_draws_the_same_prompts_and_keeps_its_snapshots(tmp_path: Path) -> None:
    run = _run(tmp_path, rollout={"staleness": 1})
    _mark_weights(run, 5.0)
    run.rollout()
    mark = run._mark()
    before = [float(s[next(iter(s))].flatten()[0]) for s in run.snapshots]
    first = run.rollout()
    _mark_weights(run, 7.0)
    run.rollout()
    run._rewind(mark)
    assert [float(s[next(iter(s))].flatten()[0]) for s in run.snapshots] == before
    again = run.rollout()
    assert [e.prompt for e in again.examples] == [e.prompt for e in first.examples]
    assert again.batch.completions == first.batch.completions


def test_state_and_restore_keep_the_snapshots_and_the_steering(tmp_path: Path) -> None:
    run = _run(tmp_path, rollout={"staleness": 2})
    for step in range(2):
        _mark_weights(run, float(step))
        run.rollout()
    run.steer(3, {"optim": {"lr": 1e-4}})
    state = run.state()
    other = _run(tmp_path / "other", rollout={"staleness": 2})
    other.restore(state)
    assert len(other.snapshots) == 2
    assert other.config_version == 3 and other.cfg.optim.lr == 1e-4
    assert other.prompt_rng.random() == run.prompt_rng.random()
    # version 0 (no change) is not applied: the start config stays
    fresh = _run(tmp_path / "fresh")
    fresh.restore({**fresh.state(), "steering": {"version": 0, "overrides": {"steps": 9}}})
    assert fresh.cfg.steps == 4 and fresh.config_version == 0


def test_random_states_come_back_as_tuples() -> None:
    rng = random.Random(3)
    version, internal, gauss = rng.getstate()
    state = _as_random_state([version, list(internal), gauss])
    other = random.Random()
    other.setstate(state)
    assert other.random() == rng.random()


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_device("cuda")


@dataclass(frozen=True)
class _TwoRanks(World):
    """Two ranks that hold the same share: every sum doubles and the maximum is the slower
    rank's (`other_elapsed`), as the collectives would return them."""

    other_elapsed: float = 0.0

    def sums(self, values: Any) -> list[float]:
        return [2 * v for v in values]

    def max(self, value: float) -> float:
        return max(value, self.other_elapsed)


def _rollout(rewards: list[float], tokens: list[int], elapsed: float) -> _Rollout:
    rows = len(rewards)
    mask = torch.zeros(rows, 4, dtype=torch.bool)
    for row, n in enumerate(tokens):
        mask[row, :n] = True
    batch = cast(RolloutBatch, SimpleNamespace(response_mask=mask))  # all _batch_stats reads
    grades = {"grader/a": 0.5, "grader_errors": 0.25}
    return _Rollout(batch, [], torch.tensor(rewards), grades, elapsed)


def test_batch_stats_of_one_process() -> None:
    ro = _rollout([1.0, 0.0, 0.5, 1.0], [4, 2, 3, 3], elapsed=2.0)
    stats = _batch_stats(World(), ro, zero_adv=0.5, group_size=2)
    assert stats == {
        "reward_mean": 0.625,
        "reward_std": pytest.approx(math.sqrt(0.6875 / 3)),
        "grader/a": 0.5,
        "grader_errors": 0.25,
        "zero_adv_groups": 0.5,
        "response_len": 3.0,
        "tokens_per_s": 6.0,
        "rollout_time": 2.0,
    }


def test_batch_stats_over_two_ranks_are_the_whole_batchs() -> None:
    ro = _rollout([1.0, 0.0, 0.5, 1.0], [4, 2, 3, 3], elapsed=2.0)
    stats = _batch_stats(_TwoRanks(size=2, other_elapsed=4.0), ro, zero_adv=0.5, group_size=2)
    # 8 rows summing to 5 (squares: 4.5): mean 0.625, sample std sqrt((4.5 - 8 * 0.625**2) / 7)
    assert stats == {
        "reward_mean": 0.625,
        "reward_std": pytest.approx(math.sqrt(1.375 / 7)),
        "grader/a": 0.5,  # the mean of the ranks' means
        "grader_errors": 0.25,
        "zero_adv_groups": 0.5,
        "response_len": 3.0,
        "tokens_per_s": 24 / 4.0,  # every rank's tokens over the slowest rank's time
        "rollout_time": 4.0,
    }


def test_batch_stats_of_a_batch_with_no_time() -> None:
    ro = _rollout([1.0, 0.0], [1, 1], elapsed=0.0)
    stats = _batch_stats(World(), ro, zero_adv=0.0, group_size=2)
    assert stats["tokens_per_s"] == pytest.approx(2 / 1e-9)


class _EngineRecorder:
    """Stands in for the vLLM engine (`core.rollout.vllm_engine.VLLMEngine`, tested on a GPU in
    tests/vllm/) where this file checks what the run hands it: the weights of which policy,
    and which seed. It samples with `generate` on the run's own model."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.loaded: list[float] = []
        self.seeds: list[int] = []

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> float:
        named = dict(weights)
        assert set(named) == {n for n, _ in self.run.lm.module.named_parameters()}
        self.loaded.append(float(named[self.run.lm.trainable()[0][0]].flatten()[0]))
        return 0.25

    def sample(self, ids: list[list[int]], *, group_size: int, seed: int, **kw: Any) -> Any:
        self.seeds.append(seed)
        rows = [p for p in ids for _ in range(group_size)]
        gen = torch.Generator().manual_seed(seed)
        return generate(self.run.lm, rows, max_new_tokens=kw["max_new_tokens"], generator=gen)


def _engine_run(tmp_path: Path, staleness: int) -> tuple[_Run, _EngineRecorder]:
    run = _run(tmp_path, rollout={"staleness": staleness})
    engine = _EngineRecorder(run)
    # as with rollout.engine="vllm": the engine holds the rollout copy, the run none
    run.engine, run.separate_rollout, run.rollout_lm = cast(Any, engine), False, run.lm
    return run, engine


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_the_engine_gets_the_policy_exactly_staleness_steps_old(
    tmp_path: Path, staleness: int
) -> None:
    run, engine = _engine_run(tmp_path, staleness)
    for step in range(5):
        _mark_weights(run, float(step))
        ro = run.rollout()
        assert ro.grade_metrics["weight_sync_time"] == 0.25
    assert engine.loaded == [float(max(step - staleness, 0)) for step in range(5)]
    assert len(run.snapshots) == (staleness + 1 if staleness else 0)
    # the current weights came back after a stale policy was handed over
    assert _rollout_value(run) == 4.0


def test_the_engines_seeds_come_from_the_runs_sampling_stream(tmp_path: Path) -> None:
    run, engine = _engine_run(tmp_path, 0)
    for _ in range(3):
        run.rollout()
    gen = torch.Generator().manual_seed(run.cfg.seed + 1)  # the sampling stream's seed
    assert engine.seeds == [int(torch.randint(0, 2**31, (1,), generator=gen)) for _ in range(3)]


def test_a_stale_lora_policy_is_merged_from_its_own_adapters(tmp_path: Path) -> None:
    """With LoRA the engine gets the base with the *stale* adapters merged in, and the run
    keeps training its current adapters."""
    from core.models.hf import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "llama")
    run = _run(tmp_path / "run", model={"name": f"hf:{hf}", "lora": {"r": 4, "alpha": 32}})
    assert run.lm.has_adapters
    stale = run.lm.snapshot()  # the adapters as loaded: B = 0, the base itself
    merged_then = {n: t.clone() for n, t in run.lm.inference_weights()}
    _mark_weights(run, 0.01)  # the adapters trained since
    now = run.lm.snapshot()
    assert any(
        not torch.equal(t, merged_then[n]) for n, t in run.lm.inference_weights()
    )  # a current merge differs from the stale one
    handed = dict(run._engine_weights(stale))
    assert set(handed) == set(merged_then)
    assert all(torch.equal(handed[n], merged_then[n]) for n in merged_then)
    assert all(torch.equal(t, now[n]) for n, t in run.lm.snapshot().items())
    # without a stale snapshot: the current merge
    current = dict(run._engine_weights(None))
    assert any(not torch.equal(current[n], merged_then[n]) for n in merged_then)


def test_a_checkpoint_is_announced_with_its_folder(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.step = 3
    path = run.checkpoint()
    assert path is not None and path.is_dir()
    assert cast(Recorder, run.cb).checkpoints == [3]
    other_rank = _Run(
        small_config(), tmp_path / "rank1", Recorder(), world=_TwoRanks(rank=1, size=2)
    )
    assert other_rank.checkpoint() is None  # rank 0 writes the replica
    assert cast(Recorder, other_rank.cb).checkpoints == []


def test_a_warmup_stopped_midway_checkpoints_and_says_so(tmp_path: Path) -> None:
    run = _Run(small_config(task={"warmup_steps": 3}), tmp_path, Recorder(stop_after=0))
    assert run.warm.total == 3
    assert run.warmup() is False
    assert cast(Recorder, run.cb).checkpoints == [0]
    assert run.warm.done < 3
    done = _run(tmp_path / "done")
    assert done.warm.finished and done.warmup() is True


class _Asked(Recorder):
    """Always says stop, and counts how often it was asked."""

    def __init__(self) -> None:
        super().__init__(stop_after=0)
        self.asked = 0

    def should_stop(self) -> bool:
        self.asked += 1
        return True


def test_one_process_stops_inside_a_step_and_ranks_at_its_boundary(tmp_path: Path) -> None:
    single = _Run(small_config(), tmp_path, _Asked())
    with pytest.raises(StopRequested):
        single.rollout()
    ranks_cb = _Asked()
    ranks = _Run(small_config(), tmp_path / "ranks", ranks_cb, world=_TwoRanks(size=2))
    assert ranks.stop.in_step() is False  # heard (asked), kept for the step boundary
    assert ranks_cb.asked == 1


@pytest.mark.parametrize(("estimator", "full"), [("exact", True), ("topk", False)])
def test_only_the_exact_estimator_keeps_full_log_probs(
    tmp_path: Path, estimator: str, full: bool
) -> None:
    run = _run(tmp_path, algorithm={"estimator": estimator})
    view = run.rollout().batch.behavior
    assert (view.full_logprobs is not None) is full


def test_the_engines_sampling_time_is_its_own(tmp_path: Path) -> None:
    run, _ = _engine_run(tmp_path, 0)
    t0 = time.perf_counter()
    ro = run.rollout()
    assert 0.0 < ro.elapsed <= time.perf_counter() - t0


@pytest.mark.parametrize("dirty", [False, True])
def test_a_stop_during_the_update_rewinds_only_a_step_not_begun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dirty: bool
) -> None:
    run = _run(tmp_path)
    before = run.prompt_rng.getstate()

    def stopped(*args: Any) -> dict[str, float]:
        run.stop.partial = dirty  # True: an optimizer step had been taken
        raise StopRequested("stop")

    monkeypatch.setattr(run, "update", stopped)
    with pytest.raises(StopRequested):
        run.run_step()
    assert (run.prompt_rng.getstate() == before) is not dirty
    assert run.step == 0
