"""Does the reasoning-gym example learn? `examples/reasoning_gym.yaml`, run as shipped for several
seeds, its curves summarised by the experiments code (`core.experiments.stats.curves`: the median
over seeds and the min-max band at every step) and drawn to a PNG.

For each seed: the answer warm-up, then the RL steps, with the 100 held-out questions (generated
with another seed, none of them a training question) evaluated before the first RL step
(`eval_on_start`: the warm-up's model) and every `eval_every` steps. Prints the per-seed held-out
reward before and after RL, and the median [min, max] of the training and held-out curves.

    python examples/build_chat_model.py                    # once: the locally built chat Llama
    python bench/reasoning_gym_example.py --seeds 4 --png docs/reasoning-gym-curve.png

Each seed is a process with one torch thread (`--workers` at once); `--steps` overrides the
spec's RL steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.seed_runs import add_seed_options, read_rows, run_seeds  # noqa: E402  (after the path above)

SPEC = ROOT / "examples" / "reasoning_gym.yaml"


def run_seed(seed: int, out: Path, steps: int | None) -> dict[str, Any]:
    import torch

    from core.training.trainer import train
    from pdppo.spec import load_spec

    torch.set_num_threads(1)
    spec = load_spec(SPEC)
    updates: dict[str, Any] = {"seed": seed, "checkpoint_every": 0, "log_samples_every": 0}
    if steps is not None:
        updates["steps"] = steps
    cfg = spec.train.model_copy(update=updates)
    cfg = type(cfg).model_validate(cfg.model_dump())
    out.mkdir(parents=True, exist_ok=True)
    train(cfg, out)
    return {
        "seed": seed,
        "metrics": read_rows(out / "metrics.jsonl"),
        "evals": read_rows(out / "eval.jsonl"),
    }


def _band(curve: dict[str, list[float]], i: int) -> str:
    return f"{curve['median'][i]:.3f} [{curve['low'][i]:.3f}, {curve['high'][i]:.3f}]"


def summarise(runs: list[dict[str, Any]], png: Path | None) -> None:
    from core.experiments.stats import curves

    train_series = {"train": {r["seed"]: r["metrics"] for r in runs}}
    eval_series = {"held-out": {r["seed"]: r["evals"] for r in runs}}
    train_curve = curves(train_series, "reward_mean")["train"]
    eval_curve = curves(eval_series, "eval_reward_mean")["held-out"]
    for r in runs:
        first, last = r["evals"][0], r["evals"][-1]
        print(
            f"seed {r['seed']}: held-out reward {first['eval_reward_mean']:.3f} (step "
            f"{first['step']}) -> {last['eval_reward_mean']:.3f} (step {last['step']}); "
            f"greedy {first.get('eval_greedy_reward_mean', float('nan')):.3f} -> "
            f"{last.get('eval_greedy_reward_mean', float('nan')):.3f}"
        )
    print(f"\nheld-out reward, median [min, max] over {len(runs)} seeds")
    for i, step in enumerate(eval_curve["step"]):
        print(f"  step {int(step):>4}: {_band(eval_curve, i)}")
    n = len(train_curve["step"])
    print("training reward_mean (per step), median [min, max]")
    for i in sorted({0, n // 4, n // 2, 3 * n // 4, n - 1}):
        print(f"  step {int(train_curve['step'][i]):>4}: {_band(train_curve, i)}")
    if png is not None:
        plot(train_curve, eval_curve, len(runs), png)
        print(f"\nplot: {png}")


def plot(
    train_curve: dict[str, list[float]], eval_curve: dict[str, list[float]], seeds: int, png: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for curve, label, marker in (
        (train_curve, "training reward (per step)", ""),
        (eval_curve, "held-out reward (100 questions x 4 samples)", "o"),
    ):
        (line,) = ax.plot(curve["step"], curve["median"], marker=marker, label=label)
        ax.fill_between(
            curve["step"], curve["low"], curve["high"], alpha=0.15, color=line.get_color()
        )
    ax.set_xlabel("RL step (after the answer warm-up)")
    ax.set_ylabel(f"reward: median of {seeds} seeds, min-max band")
    ax.set_title("examples/reasoning_gym.yaml: spell_backward, 0.5M-parameter chat Llama")
    ax.legend(loc="lower right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_seed_options(p, seeds=4, out=ROOT / "runs" / "bench-reasoning-gym")
    p.add_argument("--png", type=Path, default=None, help="write the curves here")
    args = p.parse_args(argv)
    runs = run_seeds(run_seed, args)
    if runs is None:
        return 2
    summarise(runs, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
