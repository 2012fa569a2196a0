"""A fixed-seed run's metrics, value for value, as the trainer reported them when they were
recorded (tests/core/data/fixed_seed_metrics.json, with the commit): a change of the trainer's
structure (the recipe, the loss's arguments, the update's bookkeeping) must leave every number
of every step as it was, not just close.

Three runs of examples/smoke.yaml's first 5 steps on the CPU: the spec as it is (one minibatch,
the fused loss; its first steps reward nothing, so they pin the statistics only), and two
off-policy variants that learn (a format warm-up, a stale rollout, 2 epochs x 2 minibatches,
gradient accumulation, a KL penalty), one through the fused loss and one through the unfused
loss with another mask, divergence and loss aggregation, so that every path of the update is
pinned.

The runs take one torch thread: reductions split over several threads add in another order, and
2 threads gave other last bits than 1 in most metrics. The numbers are this torch build's (the
recorded file names it): another build or CPU may round differently.

Recording again (`python -m tests.core.test_fixed_seed_metrics`) is for a change that means to
change the numbers, and says so in its commit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from core.config import TrainConfig
from core.training.trainer import TrainerCallback, train
from pdppo.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).parent / "data" / "fixed_seed_metrics.json"
STEPS = 5

WALL_CLOCK = {
    "tokens_per_s": "tokens over the rollout's measured seconds",
    "rollout_time": "seconds the rollout took",
    "update_time": "seconds the update took",
    "step_time": "seconds the step took",
}
"""Metrics measured with a clock (their keys are still compared), with the reason each is left
out of the value comparison."""

OFF_POLICY: dict[str, Any] = {
    # a format warm-up first: its digits earn partial credit, so groups have a spread of
    # rewards, nonzero advantages and losses, and the masks fire (the smoke spec's first steps
    # all reward 0)
    "task": {"warmup_steps": 30},
    "rollout": {"staleness": 1},
    "algorithm": {"minibatches": 2, "epochs": 2, "kl_beta": 0.1},
    "optim": {"grad_accumulation": 2},
}

RUNS: dict[str, dict[str, Any]] = {
    "smoke": {},
    "off-policy-fused": OFF_POLICY,
    "off-policy-unfused": {
        **OFF_POLICY,
        "algorithm": {
            **OFF_POLICY["algorithm"],
            "fused_loss": False,
            "mask": "dppo",
            "kind": "kl",
            "loss_agg": "seq_mean",
        },
    },
}
"""Each run: examples/smoke.yaml's `train` with these sections merged in."""


def run_config(name: str) -> TrainConfig:
    data = load_spec(REPO / "examples" / "smoke.yaml").train.model_dump()
    for section, values in RUNS[name].items():
        data[section] = {**data[section], **values}
    return TrainConfig.model_validate(data)


class FirstSteps(TrainerCallback):
    """Keeps every step's metrics as `on_step` hands them over; stops after `STEPS`."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append(dict(metrics))

    def should_stop(self) -> bool:
        return len(self.rows) >= STEPS


def first_steps(name: str, out: Path) -> list[dict[str, float]]:
    """The run's first `STEPS` metrics, on one torch thread."""
    cb = FirstSteps()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(run_config(name), out, callback=cb)
    finally:
        torch.set_num_threads(threads)
    assert (result.step, result.stopped) == (STEPS, True)
    return cb.rows


def comparable(row: dict[str, float]) -> dict[str, float | None]:
    """The row with its wall-clock values blanked (the key stays)."""
    return {k: (None if k in WALL_CLOCK else v) for k, v in row.items()}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_fixed_seed_run_reports_the_recorded_metrics(tmp_path: Path, name: str) -> None:
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    assert recorded["torch"] == torch.__version__, "recorded with another torch build"
    want = recorded["runs"][name]
    got = [comparable(row) for row in first_steps(name, tmp_path)]
    assert len(want) == STEPS
    for step, (row, wanted) in enumerate(zip(got, want, strict=True), start=1):
        assert sorted(row) == sorted(wanted), step
        differ = {k: (row[k], wanted[k]) for k in row if row[k] != wanted[k]}
        assert differ == {}, f"{name}, step {step}: (now, recorded) {differ}"


def record(out_root: Path) -> None:
    """Writes the recorded file from runs of the code as it is now."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    runs = {name: [comparable(r) for r in first_steps(name, out_root / name)] for name in RUNS}
    data = {
        "recorded_at": commit,
        "spec": "examples/smoke.yaml",
        "steps": STEPS,
        "torch": torch.__version__,
        "torch_threads": 1,
        "wall_clock_not_compared": WALL_CLOCK,
        "runs": runs,
    }
    RECORDED.parent.mkdir(parents=True, exist_ok=True)
    RECORDED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        record(Path(tmp))
    print(f"recorded {RECORDED}", file=sys.stderr)
