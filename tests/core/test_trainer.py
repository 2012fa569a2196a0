"""The training loop on the built-in tiny model: it learns something, logs finite metrics, stops
when asked, and a resumed run reproduces an uninterrupted one exactly (CPU, fixed seed)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from core.checkpoint import latest_checkpoint, list_checkpoints
from core.config import TrainConfig
from core.models import load_model
from core.trainer import TrainerCallback, group_advantages, train

TIMING = {"tokens_per_s", "rollout_time", "update_time", "step_time"}
REQUIRED = {
    "step",
    "reward_mean",
    "reward_std",
    "loss",
    "masked_fraction",
    "masked_fraction_pos",
    "masked_fraction_neg",
    "divergence_mean",
    "divergence_max",
    "direction_disagreement",
    "entropy",
    "grad_norm",
    *TIMING,
}


def small_config(**overrides: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}},
        "task": {"name": "reverse", "min_len": 2, "max_len": 3},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "algorithm": {"mask": "predictive", "top_k": 8, "minibatches": 2},
        "optim": {"lr": 3e-3},
        "steps": 4,
        "checkpoint_every": 2,
        "seed": 0,
        "device": "cpu",
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return TrainConfig.model_validate(data)


def read_metrics(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


class Recorder(TrainerCallback):
    def __init__(self, stop_after: int | None = None) -> None:
        self.steps: list[int] = []
        self.checkpoints: list[int] = []
        self.stop_after = stop_after

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        assert not self.checkpoints or self.checkpoints[-1] < step  # on_step before checkpoint
        self.steps.append(step)

    def on_checkpoint(self, step: int, path: Path) -> None:
        assert path.is_dir()
        self.checkpoints.append(step)

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.steps) >= self.stop_after


def test_short_run_changes_every_parameter_and_logs_finite_metrics(tmp_path: Path) -> None:
    cfg = small_config()
    torch.manual_seed(cfg.seed)
    initial = {
        n: p.detach().clone() for n, p in load_model(cfg.model, torch.device("cpu")).trainable()
    }
    rec = Recorder()
    result = train(cfg, tmp_path, callback=rec)
    assert result.step == 4 and not result.stopped
    assert result.final_model == tmp_path / "final"
    assert rec.steps == [1, 2, 3, 4] and rec.checkpoints == [2, 4]
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert set(final) == set(initial)
    unchanged = [n for n, t in initial.items() if torch.equal(t, final[n])]
    assert unchanged == []
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert set(row) >= REQUIRED
        assert all(isinstance(v, float) and math.isfinite(v) for v in row.values())
        assert 0.0 <= row["reward_mean"] <= 1.0
        assert 0.0 <= row["masked_fraction"] <= 1.0


def _strip_timing(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


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

    assert _strip_timing(read_metrics(part)) == _strip_timing(read_metrics(full))
    a = load_file(str(full / "final" / "model.safetensors"))
    b = load_file(str(part / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_stop_during_warmup_leaves_no_checkpoint_and_resume_starts_over(tmp_path: Path) -> None:
    """A cancel or worker shutdown mid warm-up must not save a half-warmed model as step 0."""

    class StopInWarmup(TrainerCallback):
        def __init__(self) -> None:
            self.asked = 0
            self.logs: list[str] = []

        def should_stop(self) -> bool:
            self.asked += 1
            return self.asked > 3  # three warm-up steps, then stop

        def on_log(self, message: str) -> None:
            self.logs.append(message)

    cfg = small_config(steps=3, checkpoint_every=1, task={"warmup_steps": 10})
    cb = StopInWarmup()
    stopped = train(cfg, tmp_path / "part", callback=cb)
    assert stopped.stopped and stopped.step == 0 and stopped.final_model is None
    assert cb.asked == 4 and "stopped during the warm-up" in cb.logs
    assert latest_checkpoint(tmp_path / "part") is None
    resumed = train(cfg, tmp_path / "part", resume=True)
    train(cfg, tmp_path / "full")
    assert resumed.step == 3
    assert _strip_timing(read_metrics(tmp_path / "part")) == _strip_timing(
        read_metrics(tmp_path / "full")
    )


def test_resume_without_checkpoint_starts_fresh_and_keeps_last_n(tmp_path: Path) -> None:
    cfg = small_config(steps=5, checkpoint_every=1, keep_checkpoints=2)
    result = train(cfg, tmp_path, resume=True)
    assert result.step == 5
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000004", "step-000005"]
    # resuming a finished run does no more steps and leaves the metrics alone
    again = train(cfg, tmp_path, resume=True)
    assert again.step == 5 and len(read_metrics(tmp_path)) == 5


def test_group_advantages() -> None:
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    assert torch.allclose(group_advantages(r, 2, False), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    norm = group_advantages(r, 2, True)
    assert torch.allclose(norm[:2], torch.tensor([1.0, -1.0]) / math.sqrt(2), atol=1e-4)
    assert torch.equal(norm[2:], torch.zeros(2))


def test_low_precision_stale_rollouts_make_the_mask_work(tmp_path: Path) -> None:
    cfg = small_config(
        steps=3,
        checkpoint_every=0,
        task={"warmup_steps": 20},  # peaked enough that an lr-1e-2 update moves TV past delta
        rollout={"dtype": "bfloat16", "staleness": 1},
        algorithm={"minibatches": 4, "delta_low": 0.05, "delta_high": 0.05},
        optim={"lr": 1e-2},
    )
    train(cfg, tmp_path)
    rows = read_metrics(tmp_path)
    assert all(r["offpolicy_logratio_abs"] > 0 for r in rows)  # mu != pi from the first update
    assert max(r["masked_fraction"] for r in rows) > 0


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


@pytest.mark.parametrize(
    ("algorithm", "rollout"),
    [
        ({"mask": "ppo_clip", "estimator": "binary"}, {"top_p": 0.9}),
        ({"mask": "dppo", "estimator": "binary", "kind": "kl", "delta_low": 0.05}, {}),
        ({"mask": "predictive", "estimator": "exact", "epochs": 2}, {"top_p": 0.8}),
        ({"mask": "predictive", "estimator": "topk_tail", "kind": "kl_reverse"}, {}),
        ({"mask": "none", "normalize_std": True}, {"temperature": 0.7, "dtype": "float16"}),
    ],
    ids=["ppo_clip-top_p", "dppo-kl", "exact-top_p-epochs", "topk_tail-kl_reverse", "none-fp16"],
)
def test_algorithm_and_sampling_variants_train_with_finite_metrics(
    tmp_path: Path, algorithm: dict[str, Any], rollout: dict[str, Any]
) -> None:
    cfg = small_config(
        steps=2, checkpoint_every=0, task={"warmup_steps": 5}, algorithm=algorithm, rollout=rollout
    )
    result = train(cfg, tmp_path)
    assert result.step == 2
    rows = read_metrics(tmp_path)
    assert all(math.isfinite(v) for r in rows for v in r.values())


class StopInside(Recorder):
    """Asks to stop from inside step `step` once the trainer is in `where` (the function that
    asked: `generate` for the rollout, `update` for the minibatch loop)."""

    def __init__(self, step: int, where: str) -> None:
        super().__init__()
        self.step, self.where = step, where
        self.logs: list[str] = []

    def should_stop(self) -> bool:
        import inspect

        callers = [frame.function for frame in inspect.stack()[1:4]]
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
    assert _strip_timing(read_metrics(tmp_path / "part")) == _strip_timing(
        read_metrics(tmp_path / "full")
    )


def test_stop_between_minibatches_discards_the_partial_update(tmp_path: Path) -> None:
    """Once a step's first minibatch has updated the weights, its state is no step's: nothing is
    saved, and a resume redoes the step from the latest checkpoint."""
    cfg = small_config(steps=4, checkpoint_every=1, algorithm={"minibatches": 4})
    train(cfg, tmp_path / "full")

    class SecondMinibatch(StopInside):
        calls = 0

        def should_stop(self) -> bool:
            if super().should_stop():
                self.calls += 1
            return self.calls >= 2  # the first minibatch has run, the second is next

    cb = SecondMinibatch(step=3, where="update")
    stopped = train(cfg, tmp_path / "part", callback=cb)
    assert stopped.stopped and stopped.step == 2 and cb.checkpoints == [1, 2]
    assert cb.logs[-1] == (
        "stopped between minibatch updates of step 3; its partial update is discarded; "
        "the latest checkpoint (step 2) is kept"
    )
    assert latest_checkpoint(tmp_path / "part") == tmp_path / "part" / "checkpoints" / "step-000002"
    train(cfg, tmp_path / "part", resume=True)
    assert _strip_timing(read_metrics(tmp_path / "part")) == _strip_timing(
        read_metrics(tmp_path / "full")
    )
