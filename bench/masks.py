"""Which trust-region mask learns best when the behavior policy drifts from the trained one?

Same task, model, budget and seeds for every mask; only `algorithm` changes. The setting is one
where a trust region matters: stale rollouts (the policy `--staleness` steps old), sampled in
bf16 against fp32 training, with several minibatch updates per rollout batch. Prints, per mask,
the median and spread (min-max over seeds) of the final reward (mean of the last 10% of steps),
the steps to reach a reward threshold (5-step running mean), the fraction of tokens masked and
the time per step, and writes a PNG of the reward curves (median over seeds, min-max band).

Medians of a few seeds move by more than the gaps between masks from one seed set to another,
so the runs are paired: seed s gives every mask the same prompts and initial weights, and each
mask is compared with `--baseline` (DPPO binary-TV) by its per-seed difference in final reward
and in steps to the threshold, with a 95% bootstrap interval of the mean difference (10,000
resamples of the seeds). An interval that holds 0 is no evidence either way.

    python bench/masks.py --seeds 16 --steps 80 --workers 2 --out runs/bench-masks

`--engine vllm` samples with vLLM instead (`core.rollout.vllm_engine`, the `vllm` extra): the real
engine's kernels and top-K view against the trainer, on a Llama built locally (heads of 64, as
vLLM's CPU kernels need), fp32 rollouts, so the mismatch is the engine's and the staleness'.
The `exact` variant needs full rows of mu, which vLLM does not return, and is left out.

Times are wall clock with one torch thread per worker; on a shared CPU they are noisy, so
compare the time column within one run only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "ppo_clip": {"mask": "ppo_clip", "estimator": "binary", "delta_low": 0.2, "delta_high": 0.2},
    "dppo binary-TV": {"mask": "dppo", "estimator": "binary"},
    "dppo topK-TV": {"mask": "dppo", "estimator": "topk"},
    "predictive topK-TV": {"mask": "predictive", "estimator": "topk"},
    "predictive exact-TV": {"mask": "predictive", "estimator": "exact"},
    "none": {"mask": "none", "estimator": "binary"},
}


def base_config(args: argparse.Namespace, seed: int, algorithm: dict[str, Any]) -> dict[str, Any]:
    vllm = args.engine == "vllm"
    return {
        "model": {"name": f"hf:{args.model}" if vllm else "builtin:tiny"},
        "task": {
            "name": "reverse",
            "min_len": 3,
            "max_len": 3,
            "warmup_steps": args.warmup,
            "warmup_target": "answer",
        },
        "rollout": {
            "prompts_per_step": 16,
            "group_size": 8,
            "max_new_tokens": 6,
            "dtype": "float32" if vllm else args.rollout_dtype,
            "staleness": args.staleness,
            "engine": args.engine,
            "vllm_memory": 0.08,
        },
        "algorithm": {
            "kind": "tv",
            "top_k": 20,
            "delta_low": 0.15,
            "delta_high": 0.15,
            "minibatches": args.minibatches,
            **algorithm,
        },
        "optim": {"lr": args.lr},
        "steps": args.steps,
        "checkpoint_every": 0,
        "seed": seed,
        "device": "cpu",
    }


def run_one(job: tuple[str, int, dict[str, Any], str]) -> tuple[str, int, list[dict[str, float]]]:
    import torch

    torch.set_num_threads(1)
    from core.config import TrainConfig
    from core.training.trainer import train

    name, seed, cfg, out = job
    out_dir = Path(out) / name.replace(" ", "_") / f"seed{seed}"
    train(TrainConfig.model_validate(cfg), out_dir)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    # keep the bench output small: weights are not needed
    import shutil

    shutil.rmtree(out_dir / "final", ignore_errors=True)
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    return name, seed, rows


def steps_to(rewards: list[float], threshold: float, window: int = 5) -> int | None:
    for i in range(window, len(rewards) + 1):
        if sum(rewards[i - window : i]) / window >= threshold:
            return i
    return None


def summarize(runs: dict[str, dict[int, list[dict[str, float]]]], threshold: float) -> str:
    head = (
        f"{'mask':<22}{'final reward':>22}{'steps to ' + format(threshold, '.2f'):>20}"
        f"{'masked frac':>14}{'s/step':>9}"
    )
    lines = [head, "-" * len(head)]
    for name in VARIANTS:
        seeds = runs.get(name, {})
        if not seeds:
            continue
        finals, reach, masked, step_s = [], [], [], []
        for rows in seeds.values():
            finals.append(final_reward(rows))
            reach.append(steps_to(_rewards(rows), threshold))
            masked.append(statistics.fmean(r["masked_fraction"] for r in rows))
            step_s.append(statistics.fmean(r["step_time"] for r in rows))
        hit = sorted(s for s in reach if s is not None)
        reach_txt = (
            f"{statistics.median(hit):.0f} ({len(hit)}/{len(reach)} hit)" if hit else "never"
        )
        final_txt = f"{statistics.median(finals):.3f} [{min(finals):.3f},{max(finals):.3f}]"
        lines.append(
            f"{name:<22}{final_txt:>22}{reach_txt:>20}"
            f"{statistics.median(masked):>14.4f}{statistics.median(step_s):>9.3f}"
        )
    return "\n".join(lines)


def bootstrap_ci(
    diffs: list[float], resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of `diffs` and the 2.5th and 97.5th percentiles of the means of `resamples`
    resamples with replacement (seeded: the same runs give the same interval)."""
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    return statistics.fmean(diffs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def paired(
    runs: dict[str, dict[int, list[dict[str, float]]]], baseline: str, threshold: float
) -> str:
    """Each mask against `baseline`, seed by seed: final reward and steps to `threshold`
    (over the seeds where both reached it; the counts say where only one did)."""
    base = runs.get(baseline, {})
    head = (
        f"{'vs ' + baseline:<22}{'seeds':>6}{'final reward diff [95% CI]':>30}"
        f"{'steps-to diff [95% CI]':>28}{'reached: both/only it/only base':>33}"
    )
    lines = [head, "-" * len(head)]
    for name, seeds in runs.items():
        common = sorted(set(seeds) & set(base))
        if name == baseline or len(common) < 2:
            continue
        finals = [final_reward(seeds[s]) - final_reward(base[s]) for s in common]
        mean, lo, hi = bootstrap_ci(finals)
        reach = [
            (steps_to(_rewards(seeds[s]), threshold), steps_to(_rewards(base[s]), threshold))
            for s in common
        ]
        both = [float(a - b) for a, b in reach if a is not None and b is not None]
        only_it = sum(a is not None and b is None for a, b in reach)
        only_base = sum(a is None and b is not None for a, b in reach)
        steps_txt = "-"
        if len(both) >= 2:
            s_mean, s_lo, s_hi = bootstrap_ci(both)
            steps_txt = f"{s_mean:+.1f} [{s_lo:+.1f},{s_hi:+.1f}]"
        lines.append(
            f"{name:<22}{len(common):>6}{f'{mean:+.3f} [{lo:+.3f},{hi:+.3f}]':>30}"
            f"{steps_txt:>28}{f'{len(both)}/{only_it}/{only_base}':>33}"
        )
    return "\n".join(lines)


def final_reward(rows: list[dict[str, float]]) -> float:
    """Mean reward of the last 10% of steps."""
    k = max(1, len(rows) // 10)
    return statistics.fmean(r["reward_mean"] for r in rows[-k:])


def _rewards(rows: list[dict[str, float]]) -> list[float]:
    return [r["reward_mean"] for r in rows]


def plot(runs: dict[str, dict[int, list[dict[str, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in VARIANTS:
        seeds = runs.get(name)
        if not seeds:
            continue
        curves = [[r["reward_mean"] for r in rows] for rows in seeds.values()]
        n = min(len(c) for c in curves)
        med = [statistics.median(c[i] for c in curves) for i in range(n)]
        lo = [min(c[i] for c in curves) for i in range(n)]
        hi = [max(c[i] for c in curves) for i in range(n)]
        xs = list(range(1, n + 1))
        (line,) = ax.plot(xs, med, label=name)
        ax.fill_between(xs, lo, hi, alpha=0.12, color=line.get_color())
    ax.set_xlabel("step")
    ax.set_ylabel("reward (median over seeds, min-max band)")
    ax.set_title("Trust-region masks under stale bf16 rollouts")
    ax.legend(loc="lower right", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument(
        "--warmup", type=int, default=50, help="answer warm-up steps (start reward ~0.1-0.5)"
    )
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--rollout-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--masks", nargs="*", default=list(VARIANTS), help="subset of variants")
    p.add_argument("--out", type=Path, default=Path("runs/bench-masks"))
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="who samples")
    p.add_argument("--baseline", default="dppo binary-TV", help="the variant the others face")
    args = p.parse_args()
    pool_args: dict[str, Any] = {}
    if args.engine == "vllm":
        from core.models.local_hf import make_chat_hf

        args.masks = [m for m in args.masks if VARIANTS[m]["estimator"] != "exact"]
        args.model = args.out / "model"
        if not (args.model / "config.json").exists():
            make_chat_hf(args.model)
        # a fresh process per run: one vLLM engine per process, none inherited by fork
        pool_args = {"mp_context": multiprocessing.get_context("spawn"), "max_tasks_per_child": 1}

    jobs = [
        (name, seed, base_config(args, seed, VARIANTS[name]), str(args.out))
        for seed in range(args.seeds)
        for name in args.masks
    ]
    runs: dict[str, dict[int, list[dict[str, float]]]] = {}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers, **pool_args) as pool:
        for name, seed, rows in pool.map(run_one, jobs):
            runs.setdefault(name, {})[seed] = rows
            print(f"  {name} seed {seed}: final reward {rows[-1]['reward_mean']:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs.json").write_text(json.dumps(runs))
    print(
        f"\n{args.seeds} seeds x {len(args.masks)} masks, {args.steps} steps each, reverse-3 task"
        f" after {args.warmup} answer warm-up steps,"
        f" staleness {args.staleness},"
        f" {'float32' if args.engine == 'vllm' else args.rollout_dtype} rollouts,"
        f" {args.minibatches}"
        f" minibatches, lr {args.lr}, {args.engine} engine;"
        f" total {time.perf_counter() - t0:.0f}s\n"
    )
    print(summarize(runs, args.threshold))
    print()
    print(paired(runs, args.baseline, args.threshold))
    png = args.out / "reward_curves.png"
    plot(runs, png)
    print(f"\nreward curves: {png}")


if __name__ == "__main__":
    main()
