"""`rollout.mode: async` (issue 53, `core.rollout.server`): the config's limits, an async run
with bound 0 equal to the sync run, the bound respected and what is older dropped and counted, a
server killed with SIGKILL restarted while the run goes on, a server that cannot start failing
with a code, and no server process left after a run ends, fails or stops. Real server processes
on the CPU, builtin:tiny."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from core.config import TrainConfig
from core.rollout.server import (
    START_FAILED,
    RolloutServer,
    RolloutServerError,
    Sampling,
)
from core.training.evaluation import Sample
from core.training.trainer import TrainerCallback, train
from tests.support.trainer_runs import TIMING, read_metrics, small_config

ASYNC_KEYS = {
    "sample_age_mean",
    "sample_age_max",
    "dropped_samples",
    "buffer_depth",
    "trainer_wait_s",
    "server_wait_s",
    "weight_sync_s",
    "weight_sync_bytes",
}
"""The per-step metrics an async run adds to the sync run's (which are unchanged)."""

ASYNC_TIMING = {"trainer_wait_s", "server_wait_s", "weight_sync_s", "buffer_depth"}
"""Async metrics that depend on how the two processes' timings fall."""

TINY_WEIGHT_BYTES = 191_472
"""The serialized trainable weights of `small_config`'s model (d_model 32, one layer)."""


# one torch thread in the trainer, and so in its server: reductions add in one order
pytestmark = pytest.mark.usefixtures("one_thread")


def async_config(bound: int, **overrides: Any) -> TrainConfig:
    rollout = {"mode": "async", "max_off_policy_steps": bound, **overrides.pop("rollout", {})}
    return small_config(rollout=rollout, **overrides)


class Watch(TrainerCallback):
    """Records the server's pids from the run's log lines and the steps' metrics; can kill the
    server after a step, stop the run, or fail it (raise) after a step."""

    def __init__(
        self,
        kill_after: int | None = None,
        stop_after: int | None = None,
        fail_after: int | None = None,
    ) -> None:
        self.pids: list[int] = []
        self.logs: list[str] = []
        self.steps: list[int] = []
        self.prompts: dict[int, list[str]] = {}  # the logged samples' prompts, by step
        self.kill_after, self.stop_after, self.fail_after = kill_after, stop_after, fail_after

    def on_log(self, message: str) -> None:
        self.logs.append(message)
        found = re.search(r"rollout server started \(pid (\d+)", message)
        if found:
            self.pids.append(int(found.group(1)))

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.steps.append(step)
        if step == self.kill_after:
            os.kill(self.pids[-1], signal.SIGKILL)
        if step == self.fail_after:
            raise RuntimeError("the caller failed the run")

    def on_samples(self, step: int, samples: list[Sample]) -> None:
        self.prompts[step] = [sample["prompt"] for sample in samples]

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.steps) >= self.stop_after


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0


# -- the config ----------------------------------------------------------------------------


def test_mode_defaults_to_sync_and_bound_to_one() -> None:
    r = small_config().rollout
    assert (r.mode, r.max_off_policy_steps) == ("sync", 1)


@pytest.mark.parametrize("bound", [0, 1, 999, 1000])
def test_bound_within_limits_validates(bound: int) -> None:
    assert async_config(bound).rollout.max_off_policy_steps == bound


@pytest.mark.parametrize("bound", [-1, 1001])
def test_bound_past_limits_is_refused(bound: int) -> None:
    with pytest.raises(ValidationError, match="max_off_policy_steps"):
        async_config(bound)


def test_bound_must_be_an_int() -> None:
    with pytest.raises(ValidationError, match="max_off_policy_steps"):
        async_config(True)  # type: ignore[arg-type]


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValidationError, match="mode"):
        small_config(rollout={"mode": "asynchronous"})


def test_async_refuses_staleness_and_names_the_bound() -> None:
    assert async_config(1, rollout={"staleness": 0}).rollout.staleness == 0
    with pytest.raises(ValidationError, match=r"rollout\.staleness=1") as err:
        async_config(1, rollout={"staleness": 1})
    assert "rollout.max_off_policy_steps" in str(err.value)
    assert small_config(rollout={"staleness": 1}).rollout.staleness == 1  # sync: unchanged


def test_async_refuses_vllm_fsdp_and_data_parallel() -> None:
    with pytest.raises(ValidationError, match="engine"):
        TrainConfig.model_validate(
            {"model": {"name": "hf:/m"}, "rollout": {"mode": "async", "engine": "vllm"}}
        )
    with pytest.raises(ValidationError, match=r"sharding='fsdp' does not support rollout\.mode"):
        async_config(1, sharding="fsdp")
    assert async_config(1).data_parallel_problem(1) is None
    problem = async_config(1).data_parallel_problem(2)
    assert problem is not None and "one process" in problem


# -- runs ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("spread_reward")
def test_async_with_bound_zero_equals_sync(tmp_path: Path) -> None:
    """Bound 0: the server samples step s with the policy after s updates and the sync loop's
    generator, so every metric of every step is the sync run's, bit for bit (timings aside; one
    torch thread on both sides)."""
    train(small_config(steps=4), tmp_path / "sync")
    watch = Watch()
    train(async_config(0, steps=4), tmp_path / "async", callback=watch)
    sync, asyn = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert len(sync) == len(asyn) == 4
    assert any(row["loss"] != 0 for row in sync)  # the runs learn: the updates are compared too
    for s, a in zip(sync, asyn, strict=True):
        assert set(a) == set(s) | ASYNC_KEYS
        for key in set(s) - TIMING:
            assert a[key] == s[key], key
        assert a["sample_age_max"] == a["sample_age_mean"] == 0
        assert a["dropped_samples"] == 0
        assert a["weight_sync_bytes"] == TINY_WEIGHT_BYTES
    assert len(watch.pids) == 1 and gone(watch.pids[0])  # shut down with the run


@pytest.mark.usefixtures("spread_reward")
def test_bound_one_trains_no_sample_older_than_one(tmp_path: Path) -> None:
    train(async_config(1, steps=6), tmp_path)
    rows = read_metrics(tmp_path)
    assert len(rows) == 6
    assert all(row["sample_age_max"] in (0.0, 1.0) for row in rows)
    assert all(row["dropped_samples"] == 0 for row in rows)
    # the server samples step s + 1 while the trainer updates step s: with the policy before it
    assert max(row["sample_age_max"] for row in rows) == 1


def test_samples_older_than_the_bound_are_dropped_and_counted() -> None:
    """A batch sampled with version 0 and taken at step 3 with bound 1 is dropped, counted,
    and its prompts are sampled again with the newest policy."""
    cfg = async_config(1)
    server = RolloutServer(cfg, generator_state=torch.Generator().manual_seed(1).get_state())
    try:
        weights = {n: p.detach() for n, p in _tiny(cfg).trainable()}
        server.publish(weights, version=0)
        prompts = [[1, 2, 3], [4, 5], [6], [7, 8]]
        server.submit(prompts, target_step=0, sampling=Sampling.of(cfg), tag="first")
        deadline = time.monotonic() + 120
        while server.poll() < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.publish(weights, version=3)
        taken = server.take(3)
        assert taken.finished.version == 3
        assert taken.finished.tag == "first"  # the same prompts, sampled again
        assert taken.metrics["dropped_samples"] == 16  # 4 prompts x group_size 4
        assert taken.metrics["sample_age_max"] == 0
        assert len(taken.finished.batch.completions) == 16
    finally:
        server.close()


@pytest.mark.usefixtures("spread_reward")
def test_server_killed_mid_run_is_restarted_and_the_run_finishes(tmp_path: Path) -> None:
    watch = Watch(kill_after=2)
    result = train(async_config(1, steps=5), tmp_path, callback=watch)
    assert result.final_model is not None and result.step == 5
    assert len(read_metrics(tmp_path)) == 5
    assert len(watch.pids) == 2 and watch.pids[0] != watch.pids[1]
    assert any("rollout server died" in line for line in watch.logs)
    assert all(gone(pid) for pid in watch.pids)


def test_server_that_cannot_start_fails_with_a_code(tmp_path: Path) -> None:
    cfg = async_config(1, model={"name": f"hf:{tmp_path / 'no-model'}"})
    server = RolloutServer(cfg, generator_state=torch.Generator().get_state(), startup_seconds=120)
    with pytest.raises(RolloutServerError) as err:
        server.publish({}, version=0)
    assert err.value.code == START_FAILED
    assert "no-model" in str(err.value)  # the server's own error, not just "it exited"
    assert server.pid is None
    server.close()


def test_server_not_ready_in_time_fails_with_a_code() -> None:
    cfg = async_config(1)
    server = RolloutServer(cfg, generator_state=torch.Generator().get_state(), startup_seconds=0.01)
    with pytest.raises(RolloutServerError, match="not ready within") as err:
        server.publish({}, version=0)
    assert err.value.code == START_FAILED


@pytest.mark.usefixtures("spread_reward")
def test_no_server_left_after_a_stop_and_a_resume(tmp_path: Path) -> None:
    stopped = Watch(stop_after=2)
    result = train(async_config(1, steps=4), tmp_path, callback=stopped)
    assert result.stopped and result.step == 2
    assert len(stopped.pids) == 1 and gone(stopped.pids[0])
    resumed = Watch()
    result = train(async_config(1, steps=4), tmp_path, callback=resumed, resume=True)
    assert result.step == 4 and not result.stopped
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert len(resumed.pids) == 1 and gone(resumed.pids[0])


@pytest.mark.usefixtures("spread_reward")
def test_a_stopped_and_resumed_bound_zero_run_equals_the_sync_run(tmp_path: Path) -> None:
    """The checkpoint of an async run holds the sampling generator after the last batch trained
    on and the prompt generator before the prompts not trained on yet: with bound 0 the resumed
    run goes on exactly as the sync run does."""
    train(small_config(steps=4), tmp_path / "sync")
    train(async_config(0, steps=4), tmp_path / "async", callback=Watch(stop_after=2))
    resumed = Watch()
    train(async_config(0, steps=4), tmp_path / "async", callback=resumed, resume=True)
    sync, asyn = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert [row["step"] for row in asyn] == [1, 2, 3, 4]
    for s, a in zip(sync, asyn, strict=True):
        assert {k: a[k] for k in set(s) - TIMING} == {k: s[k] for k in set(s) - TIMING}
    assert len(resumed.pids) == 1 and gone(resumed.pids[0])


@pytest.mark.usefixtures("spread_reward")
def test_a_resumed_run_asks_again_for_the_prompts_in_flight_at_its_checkpoint(
    tmp_path: Path,
) -> None:
    """Bound 1: the checkpoint after step 2 is taken with step 3's prompts drawn and asked for;
    the resumed run draws them again, so every step trains on the uninterrupted run's prompts."""
    whole = Watch()
    cfg = async_config(1, steps=4, log_samples_every=1, log_samples_count=4)
    train(cfg, tmp_path / "whole", callback=whole)
    train(cfg, tmp_path / "stopped", callback=Watch(stop_after=2))
    resumed = Watch()
    train(cfg, tmp_path / "stopped", callback=resumed, resume=True)
    assert sorted(resumed.prompts) == [3, 4]
    assert resumed.prompts == {step: whole.prompts[step] for step in (3, 4)}
    assert whole.prompts[3] != whole.prompts[4]  # the steps' prompts tell them apart


@pytest.mark.usefixtures("spread_reward")
def test_no_server_left_after_a_failed_run(tmp_path: Path) -> None:
    watch = Watch(fail_after=2)
    with pytest.raises(RuntimeError, match="the caller failed the run"):
        train(async_config(1, steps=4), tmp_path, callback=watch)
    assert len(watch.pids) == 1 and gone(watch.pids[0])


@pytest.mark.usefixtures("spread_reward")
def test_lora_sends_only_the_adapter(tmp_path: Path) -> None:
    """A LoRA run's weight sync carries the adapter's tensors: their bytes, not the base's."""
    from core.models import load_model
    from core.models.hf import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "llama")
    cfg = async_config(1, model={"name": f"hf:{hf}", "lora": {"r": 4, "alpha": 32}}, steps=2)
    lm = load_model(cfg.model, torch.device("cpu"))
    adapter = sum(p.numel() * p.element_size() for _, p in lm.trainable())
    whole = sum(p.numel() * p.element_size() for p in lm.module.parameters())
    train(cfg, tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2
    for row in rows:
        # the payload: the adapter's bytes and torch.save's framing (names, a zip directory)
        assert adapter < row["weight_sync_bytes"] < adapter + 64 * 1024
    assert adapter * 10 < whole


def _tiny(cfg: TrainConfig) -> Any:
    from core.models import load_model

    torch.manual_seed(cfg.seed)
    return load_model(cfg.model, torch.device("cpu"))
