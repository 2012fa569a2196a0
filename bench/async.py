"""Sync vs async rollouts (issue 53, item 5; a first version): steps/s and tokens/s of the same
run of builtin:tiny (examples/smoke.yaml's `train`, same seed, same steps) with `rollout.mode:
sync` and with `rollout.mode: async` (a rollout server process, `core.rollout.server`), the
modes interleaved round by round so that a change of the machine's load falls on both.

    python bench/async.py --steps 20 --rounds 3 --bound 1 --threads 1

Reported per mode: the wall time of `train()` (model load, the server's start, every step, the
final save), steps/s over the steps alone (from the first step's report to the last's: the
steady state, without the server's start), tokens/s (response tokens over that span), the
mean sample age, the final step's reward and, async, the trainer's and server's waits and the
weight sync's time and bytes (means over the steps after the first, as steps/s); with the load
average before and after. On a CPU the two processes share the machine's cores: async wins
only what the trainer and the server can do at once on cores that are free (`--threads` torch
threads each)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from core.config import TrainConfig
from core.training.trainer import TrainerCallback, train
from pdppo.spec import load_spec

REPO = Path(__file__).resolve().parents[1]


class _Clock(TrainerCallback):
    """When each step was reported."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.times.append(time.perf_counter())


LARGER: dict[str, dict[str, Any]] = {
    "model": {"tiny": {"d_model": 256, "n_layers": 4, "n_heads": 4, "max_seq_len": 64}},
    "rollout": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 16},
}
"""`--size larger`: a tiny model whose rollout and update take long enough that the two
processes' overlap can outweigh what each step's exchange costs (about 30 ms at `smoke`)."""


def config(mode: str, steps: int, bound: int, seed: int, size: str = "smoke") -> TrainConfig:
    data = load_spec(REPO / "examples" / "smoke.yaml").train.model_dump()
    if size == "larger":
        for section, values in LARGER.items():
            if section == "model":
                data["model"]["tiny"] = {**data["model"]["tiny"], **values["tiny"]}
            else:
                data[section] = {**data[section], **values}
    data["steps"] = steps
    data["seed"] = seed
    data["checkpoint_every"] = 0
    data["rollout"] = {**data["rollout"], "mode": mode, "max_off_policy_steps": bound}
    return TrainConfig.model_validate(data)


def one_run(cfg: TrainConfig) -> dict[str, Any]:
    clock = _Clock()
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        train(cfg, Path(out), callback=clock)
        wall = time.perf_counter() - t0
        rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    span = clock.times[-1] - clock.times[0]
    tokens = sum(
        r["response_len"] * cfg.rollout.prompts_per_step * cfg.rollout.group_size for r in rows[1:]
    )
    result = {
        "wall_s": wall,
        "steps_per_s": (len(rows) - 1) / span,
        "tokens_per_s": tokens / span,
        "final_reward": rows[-1]["reward_mean"],
    }
    for key in (
        "rollout_time",
        "update_time",
        "step_time",
        "sample_age_mean",
        "trainer_wait_s",
        "server_wait_s",
        "weight_sync_s",
        "weight_sync_bytes",
    ):
        if key in rows[0]:
            result[key] = statistics.fmean(r[key] for r in rows[1:])  # as steps/s: from step 2
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound", type=int, default=1, help="async: rollout.max_off_policy_steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (trainer and server)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=("smoke", "larger"), default="smoke")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
    for _ in range(args.rounds):
        for mode in ("sync", "async"):
            results[mode].append(
                one_run(config(mode, args.steps, args.bound, args.seed, args.size))
            )
    load_after = os.getloadavg()
    print(
        f"builtin:tiny (examples/smoke.yaml, size {args.size}), {args.steps} steps, "
        f"seed {args.seed}, "
        f"{args.rounds} rounds interleaved, {args.threads} torch thread(s) per process, "
        f"async bound {args.bound}; {os.cpu_count()} CPUs, load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    keys = sorted({k for runs in results.values() for r in runs for k in r})
    print(f"{'metric':<20} {'sync':>14} {'async':>14}")
    for key in keys:
        cells = []
        for mode in ("sync", "async"):
            values = [r[key] for r in results[mode] if key in r]
            cells.append(f"{statistics.median(values):14.4g}" if values else f"{'-':>14}")
        print(f"{key:<20} {cells[0]} {cells[1]}")
    ratio = statistics.median(r["steps_per_s"] for r in results["async"]) / statistics.median(
        r["steps_per_s"] for r in results["sync"]
    )
    print(f"async / sync steps/s (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
