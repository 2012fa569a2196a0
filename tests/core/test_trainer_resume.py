"""Stopping and resuming the training loop: a stop (between steps, inside a rollout, a cancel
between minibatches) keeps only a whole step's checkpoint, and a resumed run reproduces an
uninterrupted one exactly (CPU, fixed seed). Stops during the warm-up and pauses between
minibatches: tests/core/test_stop_keeps_work.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from core.training.checkpoint import latest_checkpoint, list_checkpoints
from core.training.schedule import lr_at
from core.training.trainer import train
from tests.support.trainer_runs import Recorder, read_metrics, small_config, strip_timing


@pytest.mark.parametrize(
    "extra",
    [{}, {"rollout": {"staleness": 2}, "task": {"warmup_steps": 3}}],
    ids=["on-policy", "stale+warmup"],
)
def test_stop_and_resume_reproduces_uninterrupted_run(
    tmp_path: Path, extra: dict[str, Any]
) -> None:
    cfg = small_config(steps=6, checkpoint_every=4, **extra)
    full = tmp_path / "full"
    train(cfg, full)

    part = tmp_path / "part"
    rec = Recorder(stop_after=3)
    stopped = train(cfg, part, callback=rec)
    assert stopped.stopped and stopped.step == 3 and stopped.final_model is None
    ckpt = latest_checkpoint(part)
    assert ckpt is not None and ckpt.name == "step-000003"  # stop writes a checkpoint
    resumed = train(cfg, part, resume=True)
    assert resumed.step == 6 and not resumed.stopped

    assert strip_timing(read_metrics(part)) == strip_timing(read_metrics(full))
    a = load_file(str(full / "final" / "model.safetensors"))
    b = load_file(str(part / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_without_checkpoint_starts_fresh_and_keeps_last_n(tmp_path: Path) -> None:
    cfg = small_config(steps=5, checkpoint_every=1, keep_checkpoints=2)
    result = train(cfg, tmp_path, resume=True)
    assert result.step == 5
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000004", "step-000005"]
    # resuming a finished run does no more steps and leaves the metrics alone
    again = train(cfg, tmp_path, resume=True)
    assert again.step == 5 and len(read_metrics(tmp_path)) == 5


def test_cli_train_writes_metrics_checkpoints_and_resumes(tmp_path: Path) -> None:
    import yaml
    from click.testing import CliRunner

    from pdppo.cli import main

    cfg = small_config(steps=3, checkpoint_every=2)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "train": cfg.model_dump(mode="json")}))
    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(main, ["train", str(spec), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {"step", "reward_mean", "masked_fraction", "loss"} <= set(rows[0])
    assert [p.name for p in list_checkpoints(out)] == ["step-000002", "step-000003"]
    assert (out / "final" / "model.safetensors").is_file()
    again = runner.invoke(main, ["train", str(spec), "--out", str(out), "--resume", "--quiet"])
    assert again.exit_code == 0 and "resumed from" in again.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {steps: -1}")
    failed = runner.invoke(main, ["train", str(bad)])
    assert failed.exit_code != 0 and "train.steps" in failed.output


class StopInside(Recorder):
    """Asks to stop from inside step `step` once the trainer is in `where` (the function that
    asked: `generate` for the rollout, `update` for the minibatch loop)."""

    def __init__(self, step: int, where: str) -> None:
        super().__init__()
        self.step, self.where = step, where
        self.logs: list[str] = []

    def should_stop(self) -> bool:
        import inspect

        callers = [frame.function for frame in inspect.stack()[1:5]]
        return len(self.steps) == self.step - 1 and self.where in callers

    def on_log(self, message: str) -> None:
        self.logs.append(message)


@pytest.mark.parametrize("extra", [{}, {"rollout": {"staleness": 2}}], ids=["plain", "stale"])
def test_stop_during_a_rollout_checkpoints_the_last_step_and_resumes_exactly(
    tmp_path: Path, extra: dict[str, Any]
) -> None:
    """A cancel in the middle of a long generation takes effect at once; the checkpoint it
    writes is the previous step's, as if the stop had come between steps."""
    cfg = small_config(steps=5, checkpoint_every=0, **extra)
    train(cfg, tmp_path / "full")
    cb = StopInside(step=3, where="generate")
    stopped = train(cfg, tmp_path / "part", callback=cb)
    assert stopped.stopped and stopped.step == 2 and cb.steps == [1, 2]
    assert cb.checkpoints == [2]
    assert "stopped during generation of step 3; stopped at step 2" in cb.logs
    resumed = train(cfg, tmp_path / "part", resume=True)
    assert resumed.step == 5
    assert strip_timing(read_metrics(tmp_path / "part")) == strip_timing(
        read_metrics(tmp_path / "full")
    )


def test_a_cancel_between_minibatches_discards_the_partial_update(tmp_path: Path) -> None:
    """A stop that keeps nothing (`stop_keeps_work` False: a cancel) does not wait for the
    step's other minibatches; once the first has updated the weights their state is no step's:
    nothing is saved, and a resume redoes the step from the latest checkpoint. (A pause
    finishes the step: tests/core/test_stop_keeps_work.py.)"""
    cfg = small_config(steps=4, checkpoint_every=1, algorithm={"minibatches": 4})
    train(cfg, tmp_path / "full")

    class SecondMinibatch(StopInside):
        calls = 0

        def should_stop(self) -> bool:
            if super().should_stop():
                self.calls += 1
            return self.calls >= 2  # the first minibatch has run, the second is next

        def stop_keeps_work(self) -> bool:
            return False

    cb = SecondMinibatch(step=3, where="update")
    stopped = train(cfg, tmp_path / "part", callback=cb)
    assert stopped.stopped and stopped.step == 2 and cb.checkpoints == [1, 2]
    assert cb.logs[-1] == (
        "stopped between minibatch updates of step 3; its partial update is discarded; "
        "the latest checkpoint (step 2) is kept"
    )
    assert latest_checkpoint(tmp_path / "part") == tmp_path / "part" / "checkpoints" / "step-000002"
    train(cfg, tmp_path / "part", resume=True)
    assert strip_timing(read_metrics(tmp_path / "part")) == strip_timing(
        read_metrics(tmp_path / "full")
    )


KNOBS: dict[str, Any] = {
    "optim": {"schedule": "cosine", "lr_warmup_steps": 2, "min_lr_ratio": 0.1},
    "algorithm": {"kl_beta": 0.2, "minibatches": 2},
}


def test_resume_with_schedule_kl_and_accumulation_reproduces_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """The lr is a function of the step, the reference is rebuilt from the loaded model, and
    the silence watch is checkpointed: a stop and resume changes nothing."""
    optim = {**KNOBS["optim"], "grad_accumulation": 2}
    cfg = small_config(
        steps=6,
        checkpoint_every=4,
        task={"warmup_steps": 3},
        optim=optim,
        **{"algorithm": KNOBS["algorithm"]},
    )
    full = tmp_path / "full"
    train(cfg, full)
    part = tmp_path / "part"
    assert train(cfg, part, callback=Recorder(stop_after=3)).step == 3
    assert train(cfg, part, resume=True).step == 6
    rows = read_metrics(full)
    assert strip_timing(read_metrics(part)) == strip_timing(rows)
    a = load_file(str(full / "final" / "model.safetensors"))
    b = load_file(str(part / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the knobs are on: a cosine lr from 0 through the warm-up, a KL that the warm-up made > 0
    assert [r["lr"] for r in rows] == [lr_at(s, cfg.optim, 6) for s in range(6)]
    assert rows[0]["lr"] == 0.0 and rows[2]["lr"] == 3e-3 and rows[5]["lr"] == pytest.approx(3e-4)
    assert all(r["kl_ref"] > 0 for r in rows)
