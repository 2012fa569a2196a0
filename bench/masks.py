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
and in masked fraction, with a 95% bootstrap interval of the mean difference (10,000 resamples
of the seeds) and an exact sign test, and by who reached the threshold. An interval that holds
0 is no evidence either way. The statistics are `core.experiments.report`'s, the same as the
service's experiment reports; `--out` gets them as report.json and report.csv.

    python bench/masks.py --seeds 16 --steps 80 --workers 2 --out runs/bench-masks

`--engine vllm` samples with vLLM instead (`core.rollout.vllm_engine`, the `vllm` extra): the real
engine's kernels and top-K view against the trainer, on a Llama built locally (heads of 64, as
vLLM's CPU kernels need), fp32 rollouts, so the mismatch is the engine's and the staleness'.
The `exact` variant needs full rows of mu, which vLLM does not return, and is left out.

`--setting chat-math` runs `examples/chat_math.yaml` instead (its chat Llama, built here, its
data and graders), where seeds learn: each seed's supervised warm-up runs once and every mask of
the seed starts from its weights (`--shared-warmup`: the first seed's for all), and the policy
is evaluated on the held-out questions before the first step and after the last. Its primary
metric is that last held-out reward (`--primary eval_reward_mean`), compared per seed with the
baseline in a table of its own (the command of the 16-seed run: docs/users/metrics.md).

Times are wall clock with one torch thread per worker; on a shared CPU they are noisy, so
compare the time column within one run only.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from core.experiments import report, report_csv

VARIANTS: dict[str, dict[str, Any]] = {
    "ppo_clip": {"mask": "ppo_clip", "estimator": "binary", "delta_low": 0.2, "delta_high": 0.2},
    "dppo binary-TV": {"mask": "dppo", "estimator": "binary"},
    "dppo topK-TV": {"mask": "dppo", "estimator": "topk"},
    "predictive topK-TV": {"mask": "predictive", "estimator": "topk"},
    "predictive exact-TV": {"mask": "predictive", "estimator": "exact"},
    "none": {"mask": "none", "estimator": "binary"},
    # the off-policy corrections (docs/users/corrections.md) at their published defaults: TIS's
    # cap 2 (verl's rollout_is_threshold), IcePop's band [0.5, 5] (Ring-1T); alone (no mask)
    # and TIS under the DPPO mask, as prime-rl's default loss pairs them
    "tis": {"mask": "none", "estimator": "binary", "correction": {"type": "tis", "cap": 2.0}},
    "icepop": {
        "mask": "none",
        "estimator": "binary",
        "correction": {"type": "icepop", "low": 0.5, "high": 5.0},
    },
    "dppo topK-TV + tis": {
        "mask": "dppo",
        "estimator": "topk",
        "correction": {"type": "tis", "cap": 2.0},
    },
}

COLLAPSE_MARGIN = 0.05
"""How far the end reward may fall below the start reward before the run counts as collapsed
(bench/regimes.py's docstring says why 0.05)."""


def collapsed(start: float, end: float, margin: float = COLLAPSE_MARGIN) -> bool:
    """Whether a run whose reward went from `start` to `end` collapsed: a non-finite value, or
    an end more than `margin` below the start (bench/regimes.py's criterion)."""
    if not (math.isfinite(start) and math.isfinite(end)):
        return True
    return end < start - margin


ROOT = Path(__file__).resolve().parents[1]
CHAT_DATA = ROOT / "examples" / "data"
# examples/chat_math.yaml's graders: 0.7 for the exact answer, 0.2 within 2, 0.1 for brevity
CHAT_GRADER: dict[str, Any] = {
    "type": "multi",
    "graders": {
        "answer": {"type": "numeric"},
        "close": {"type": "numeric", "tolerance": 2.0},
        "short": {"type": "length_penalty", "max_chars": 8},
    },
    "weights": {"answer": 0.7, "close": 0.2, "short": 0.1},
}


def base_config(args: argparse.Namespace, seed: int, algorithm: dict[str, Any]) -> dict[str, Any]:
    if args.setting == "chat-math":
        return chat_config(args, seed, algorithm)
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


def chat_config(args: argparse.Namespace, seed: int, algorithm: dict[str, Any]) -> dict[str, Any]:
    """`examples/chat_math.yaml`'s task and knobs, from seed `seed`'s warmed-up model (no
    warm-up of its own: every mask of a seed starts from the same weights), evaluated on the
    held-out questions once, after the last step: the primary metric is the final held-out
    reward, not the training reward of the last steps (which also rises when the policy only
    sharpens on questions it has seen)."""
    return {
        "model": {"name": f"hf:{warm_dir(args, seed)}"},
        "task": {
            "name": "jsonl",
            "path": str(CHAT_DATA / "chat_math.jsonl"),
            "validation_path": str(CHAT_DATA / "chat_math_val.jsonl"),
            "grader": CHAT_GRADER,
        },
        "rollout": {
            "prompts_per_step": 16,
            "group_size": 8,
            "max_new_tokens": 4,
            "temperature": 1.0,
            "dtype": args.rollout_dtype,
            "staleness": args.staleness,
            "engine": args.engine,
            "vllm_memory": 0.08,
        },
        "algorithm": {
            "kind": args.kind,
            "top_k": 20,
            "delta_low": args.delta,
            "delta_high": args.delta,
            "normalize_std": True,
            "minibatches": args.minibatches,
            **algorithm,
        },
        "optim": {"lr": args.lr},
        "steps": args.steps,
        "eval_every": args.steps,
        "eval_on_start": True,
        "eval_samples": args.eval_samples,
        "checkpoint_every": 0,
        "seed": seed,
        "device": "cpu",
    }


def warm_dir(args: argparse.Namespace, seed: int) -> Path:
    """Seed `seed`'s warmed-up model; with `--shared-warmup`, `--warmup-seed`'s (default the
    first seed's) for every seed (one warm-up instead of one per seed: the seeds then differ in
    RL only; naming it lets a later invocation add seeds that start where the earlier did)."""
    warm_seed = args.warmup_seed if args.shared_warmup else seed
    return (args.out / "warm" / f"seed{warm_seed}").resolve()


def warm_up(job: tuple[int, dict[str, Any], str]) -> int:
    """Seed `seed`'s supervised warm-up on the chat_math answers (examples/chat_math.yaml's:
    400 steps of 32 at lr 1e-3, its own RNG seed + 3), saved as a Hugging Face folder that
    every mask of the seed then loads: the masks differ from the first RL step on, not
    before, and the warm-up runs once per seed instead of once per run."""
    import torch

    torch.set_num_threads(1)
    from core.config import TrainConfig
    from core.models import load_model
    from core.tasks import make_task
    from core.training.callbacks import TrainerCallback
    from core.training.warmup import Warmup

    seed, cfg_dict, out = job
    cfg = TrainConfig.model_validate(cfg_dict)
    device = torch.device("cpu")
    torch.manual_seed(seed)
    lm = load_model(cfg.model, device)
    task = make_task(cfg.task, seed=seed)
    try:
        Warmup(cfg, lm).run(cfg, lm, task, TrainerCallback(), device, should_stop=lambda: False)
    finally:
        task.close()
    lm.save_final(Path(out))
    return seed


def warm_config(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The warm-up's config: the chat setting's, from the built model, with the warm-up on."""
    cfg = chat_config(args, seed, {})
    cfg["model"] = {"name": f"hf:{args.model}"}
    cfg["rollout"].update(engine="hf", dtype="float32", staleness=0)
    cfg["task"].update(
        warmup_steps=args.warmup,
        warmup_target="answer",
        warmup_lr=1e-3,
        warmup_batch_size=32,
    )
    return cfg


def add_warmup_seed(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--warmup-seed",
        type=int,
        default=None,
        help="chat-math with --shared-warmup: whose warm-up every seed starts from "
        "(default the first seed)",
    )


def warm_up_seeds(args: argparse.Namespace, seeds: range) -> None:
    """The chat setting's warm-ups that `seeds` need and the disk does not hold yet (with
    `--shared-warmup` the first seed's only), `args.workers` at a time."""
    todo = [
        (s, warm_config(args, s), str(warm_dir(args, s)))
        for s in ([args.warmup_seed] if args.shared_warmup else seeds)
        if not (warm_dir(args, s) / "config.json").exists()
    ]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for seed in pool.map(warm_up, todo):
            print(f"  seed {seed}: warmed up ({args.warmup} steps)", flush=True)


def run_one(job: tuple[str, int, dict[str, Any], str]) -> tuple[str, int, list[dict[str, float]]]:
    import torch

    torch.set_num_threads(1)
    from core.config import TrainConfig
    from core.training.trainer import train

    name, seed, cfg, out = job
    out_dir = Path(out) / name.replace(" ", "_") / f"seed{seed}"
    train(TrainConfig.model_validate(cfg), out_dir)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    evals = out_dir / "eval.jsonl"
    if evals.exists():
        join_evals(rows, [json.loads(line) for line in evals.read_text().splitlines()])
    # keep the bench output small: weights are not needed
    import shutil

    shutil.rmtree(out_dir / "final", ignore_errors=True)
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    return name, seed, rows


def save_runs(path: Path, runs: dict[str, dict[int, list[dict[str, float]]]]) -> None:
    """Every finished run's rows, written after each run (to a temporary file, then renamed),
    so that a comparison of hours stopped midway keeps all it finished and `--resume` goes on
    from there."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(runs))
    tmp.replace(path)


def load_runs(path: Path) -> dict[str, dict[int, list[dict[str, float]]]]:
    """`save_runs`' file read back, its seeds ints again (JSON keys are strings); none yet if
    there is no file."""
    if not path.exists():
        return {}
    return {
        name: {int(seed): rows for seed, rows in seeds.items()}
        for name, seeds in json.loads(path.read_text()).items()
    }


def join_evals(rows: list[dict[str, float]], evals: list[dict[str, float]]) -> None:
    """Each held-out evaluation joins the metrics row of the step it followed, so that the
    primary metric is read where the training reward is; step 0's (`eval_on_start`, the
    policy before RL) joins the first row with its keys prefixed `start_`."""
    for row in evals:
        step = int(row["step"])
        values = {k: v for k, v in row.items() if k != "step"}
        if 1 <= step <= len(rows):
            rows[step - 1].update(values)
        elif step == 0 and rows:
            rows[0].update({f"start_{k}": v for k, v in values.items()})


def summary_table(rep: dict[str, Any], times: dict[str, Any]) -> str:
    """Per mask, from `core.experiments.report`: the final reward's median [min, max] over seeds,
    the median step at which the 5-step running mean reached the threshold, the mean masked
    fraction, and the median over seeds of the mean step time (`times`: the report of
    `step_time` over whole runs)."""
    threshold = rep["threshold"]
    head = (
        f"{'mask':<22}{'final reward':>22}{'steps to ' + format(threshold, '.2f'):>20}"
        f"{'masked frac':>14}{'s/step':>9}"
    )
    lines = [head, "-" * len(head)]
    step_s = {arm["name"]: arm["final"]["median"] for arm in times["arms"]}
    for arm in rep["arms"]:
        final, reach, masked = arm["final"], arm["steps_to_threshold"], arm["masked_fraction"]
        if final["median"] is None:
            continue
        reach_txt = (
            f"{reach['median']} ({reach['reached']}/{reach['of']} hit)"
            if reach["reached"]
            else "never"
        )
        final_txt = f"{final['median']:.3f} [{final['min']:.3f},{final['max']:.3f}]"
        masked_txt = "-" if masked["mean"] is None else f"{masked['mean']:.4f}"
        time_txt = "-" if step_s.get(arm["name"]) is None else f"{step_s[arm['name']]:.3f}"
        lines.append(
            f"{arm['name']:<22}{final_txt:>22}{reach_txt:>20}{masked_txt:>14}{time_txt:>9}"
        )
    return "\n".join(lines)


def paired_table(rep: dict[str, Any]) -> str:
    """Each mask against the report's baseline on the paired seeds: the mean difference in final
    reward with its 95% bootstrap interval, the sign test (won/lost/tied, two-sided p), the
    difference in masked fraction, and who reached the threshold (both / only it / only the
    baseline)."""
    baseline = rep["baseline"]
    base = next(a for a in rep["arms"] if a["name"] == baseline)
    head = (
        f"{'vs ' + baseline:<22}{'seeds':>6}{'final reward diff [95% CI]':>30}"
        f"{'won/lost/tied':>15}{'sign p':>8}{'masked diff [95% CI]':>28}"
        f"{'reached: both/only it/only base':>33}"
    )
    lines = [head, "-" * len(head)]
    for arm in rep["arms"]:
        vs = arm["vs_baseline"]
        if vs is None or vs["mean_diff"] is None:
            continue
        sign = vs["sign_test"]
        lo, hi = vs["ci95"]
        p = "-" if sign["p_value"] is None else f"{sign['p_value']:.3f}"
        mf = vs["masked_fraction_diff"]
        mf_txt = "-"
        if mf is not None:
            mf_txt = f"{mf['mean_diff']:+.4f} [{mf['ci95'][0]:+.4f},{mf['ci95'][1]:+.4f}]"
        reach_txt = "-"
        if rep["threshold"] is not None:
            it, them = arm["steps_to_threshold"]["per_seed"], base["steps_to_threshold"]["per_seed"]
            pairs = [(it.get(str(s)), them.get(str(s))) for s in rep["paired_seeds"]]
            both = sum(a is not None and b is not None for a, b in pairs)
            only_it = sum(a is not None and b is None for a, b in pairs)
            only_base = sum(a is None and b is not None for a, b in pairs)
            reach_txt = f"{both}/{only_it}/{only_base}"
        diff_txt = f"{vs['mean_diff']:+.3f} [{lo:+.3f},{hi:+.3f}]"
        wlt = f"{sign['wins']}/{sign['losses']}/{sign['ties']}"
        lines.append(
            f"{arm['name']:<22}{len(vs['per_seed']):>6}{diff_txt:>30}{wlt:>15}{p:>8}"
            f"{mf_txt:>28}{reach_txt:>33}"
        )
    return "\n".join(lines)


LAST = 1e-9
"""A `final_fraction` that reads a run's last value of a metric: the held-out evaluation after
the last step."""


CORRECTION_SHARES = ("correction_masked_fraction", "correction_clipped_fraction")


def mean_share(seeds: Any, key: str) -> float:
    """`key`'s mean over every step of every seed's run (0 where a run has no such metric)."""
    values = [row.get(key, 0.0) for rows in seeds for row in rows]
    return sum(values) / len(values) if values else math.nan


def held_out(runs: dict[str, dict[int, list[dict[str, float]]]], baseline: str, key: str) -> str:
    """The primary metric `key` as it stood after the last step (the held-out evaluation the
    last step's row carries), per mask, and each mask against `baseline` seed by seed (the same
    report as the training reward's: paired differences, bootstrap interval, sign test), with
    the count of its seeds that collapsed: `key` after the last step more than COLLAPSE_MARGIN
    below `start_<key>`, its value before the first (or either not finite); and the shares of
    tokens the off-policy correction dropped and clipped (`CORRECTION_SHARES`), which the
    masked fraction leaves out: IcePop drops tokens with no mask at all."""
    order = [name for name in VARIANTS if name in runs]
    rep = report(runs, metric=key, baseline=baseline, final_fraction=LAST, arm_order=order)
    head = (
        f"{'after the last step: ' + key:<34}{'median [min, max]':>26}{'collapsed':>11}"
        f"{'corr. dropped':>15}{'corr. clipped':>15}"
    )
    lines = [head, "-" * len(head)]
    for arm in rep["arms"]:
        final = arm["final"]
        if final["median"] is not None:
            spread = f"{final['median']:.3f} [{final['min']:.3f}, {final['max']:.3f}]"
            seeds = runs[arm["name"]].values()
            fell = sum(
                collapsed(rows[0].get(f"start_{key}", math.nan), rows[-1].get(key, math.nan))
                for rows in seeds
            )
            shares = "".join(f"{mean_share(seeds, k):>15.4f}" for k in CORRECTION_SHARES)
            lines.append(f"{arm['name']:<34}{spread:>26}{f'{fell}/{len(seeds)}':>11}{shares}")
    return "\n".join(lines) + "\n\n" + paired_table(rep)


SMOOTH = 5
"""Steps in the running mean of the figure's reward curves (the threshold's window too)."""


def smoothed(values: list[float], window: int = SMOOTH) -> list[float]:
    """The running mean over the last `window` values (fewer at the start)."""
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out.append(sum(part) / len(part))
    return out


def plot(
    runs: dict[str, dict[int, list[dict[str, float]]]], path: Path, primary: str | None = None
) -> None:
    """The figure of a comparison: each arm's training reward per step (every seed's curve
    smoothed over `SMOOTH` steps, then their median and the band between the quartiles: the
    min-max band of 16 noisy seeds hides every gap), and with `primary` a second panel of that
    metric after the last step, every seed a dot, the arm's median a bar, the median start a
    dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    order = [name for name in VARIANTS if name in runs]
    panels = 2 if primary else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 5), squeeze=False)
    ax = axes[0][0]
    colors = {}
    for name in order:
        seeds = [[r["reward_mean"] for r in rows] for rows in runs[name].values()]
        length = min(len(s) for s in seeds)
        curves_ = np.array([smoothed(s[:length]) for s in seeds])
        steps = np.arange(1, length + 1)
        low, mid, high = np.percentile(curves_, [25, 50, 75], axis=0)
        (line,) = ax.plot(steps, mid, label=name)
        colors[name] = line.get_color()
        ax.fill_between(steps, low, high, alpha=0.12, color=line.get_color())
    ax.set_xlabel("step")
    ax.set_ylabel(f"training reward, {SMOOTH}-step mean (median, quartile band)")
    ax.set_title(f"Training reward, {len(next(iter(runs.values())))} seeds")
    ax.legend(loc="lower left", framealpha=0.9, fontsize=8)
    if primary:
        ax = axes[0][1]
        starts = [
            rows[0][f"start_{primary}"]
            for name in order
            for rows in runs[name].values()
            if f"start_{primary}" in rows[0]
        ]
        for i, name in enumerate(order):
            ends = [rows[-1].get(primary, math.nan) for rows in runs[name].values()]
            ax.scatter([i] * len(ends), ends, s=14, alpha=0.6, color=colors[name])
            ax.plot([i - 0.3, i + 0.3], [float(np.nanmedian(ends))] * 2, color=colors[name], lw=3)
        if starts:
            ax.axhline(float(np.median(starts)), ls="--", color="grey", label="before RL (median)")
            ax.legend(loc="lower left", fontsize=8)
        ax.set_xticks(range(len(order)), order, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"{primary} after the last step (dots: seeds, bar: median)")
        ax.set_title("Held-out reward after the last step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed, first-seed+1, ...")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument(
        "--warmup", type=int, default=None, help="answer warm-up steps (default 50; chat-math 400)"
    )
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--rollout-dtype", default=None, choices=["float32", "bfloat16"])
    p.add_argument("--lr", type=float, default=None, help="default 3e-3; chat-math 3e-4")
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--masks", nargs="*", default=list(VARIANTS), help="subset of variants")
    p.add_argument("--out", type=Path, default=Path("runs/bench-masks"))
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="who samples")
    p.add_argument("--baseline", default="dppo binary-TV", help="the variant the others face")
    p.add_argument(
        "--setting",
        default="reverse",
        choices=["reverse", "chat-math"],
        help="reverse-3 on builtin:tiny (or a random chat Llama with vLLM), or chat-math: "
        "examples/chat_math.yaml's chat Llama, data and graders, warmed up once per seed",
    )
    p.add_argument("--kind", default="tv", choices=["tv", "kl", "kl_reverse"], help="chat-math")
    p.add_argument("--delta", type=float, default=0.15, help="chat-math: delta_low = delta_high")
    p.add_argument(
        "--shared-warmup",
        action="store_true",
        help="chat-math: one warm-up (the first seed's) for every seed, not one per seed",
    )
    p.add_argument("--eval-samples", type=int, default=4, help="chat-math: per held-out question")
    add_warmup_seed(p)
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs --out's runs.json holds (a stopped comparison's) and run the rest",
    )
    p.add_argument(
        "--primary",
        default=None,
        help="the metric row key read after the last step for the held-out table "
        "(chat-math: eval_reward_mean)",
    )
    args = p.parse_args()
    chat = args.setting == "chat-math"
    args.warmup_seed = args.first_seed if args.warmup_seed is None else args.warmup_seed
    args.warmup = args.warmup if args.warmup is not None else (400 if chat else 50)
    args.lr = args.lr if args.lr is not None else (3e-4 if chat else 3e-3)
    if args.rollout_dtype is None:
        args.rollout_dtype = "float32" if args.engine == "vllm" and not chat else "bfloat16"
    if chat and args.primary is None:
        args.primary = "eval_reward_mean"
    pool_args: dict[str, Any] = {}
    if args.engine == "vllm" or chat:
        from core.models.local_hf import make_chat_hf

        args.model = (args.out / "model").resolve()
        if not (args.model / "config.json").exists():
            make_chat_hf(args.model)
    if args.engine == "vllm":
        args.masks = [m for m in args.masks if VARIANTS[m]["estimator"] != "exact"]
        # a fresh process per run: one vLLM engine per process, none inherited by fork
        pool_args = {"mp_context": multiprocessing.get_context("spawn"), "max_tasks_per_child": 1}

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    t0 = time.perf_counter()
    if chat:
        warm_up_seeds(args, seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "runs.json"
    runs = load_runs(saved) if args.resume else {}
    jobs = [
        (name, seed, base_config(args, seed, VARIANTS[name]), str(args.out))
        for seed in seeds
        for name in args.masks
        if seed not in runs.get(name, {})
    ]
    if args.resume:
        print(f"  resuming: {len(jobs)} runs to go, the others read from {saved}", flush=True)
    with ProcessPoolExecutor(max_workers=args.workers, **pool_args) as pool:
        for name, seed, rows in pool.map(run_one, jobs):
            runs.setdefault(name, {})[seed] = rows
            save_runs(saved, runs)
            held = f", {args.primary} {rows[-1][args.primary]:.3f}" if args.primary else ""
            print(
                f"  {name} seed {seed}: final reward {rows[-1]['reward_mean']:.3f}{held}",
                flush=True,
            )
    # the report is of these seeds and masks only, whatever else an earlier run saved
    runs = {
        name: {seed: runs[name][seed] for seed in seeds if seed in runs[name]}
        for name in args.masks
        if name in runs
    }
    task = "chat-math (examples/chat_math.yaml)" if chat else "reverse-3 task"
    extra = f", {args.kind} divergence, delta {args.delta}" if chat else ""
    if chat:
        warm = f"seed {args.first_seed}'s" if args.shared_warmup else "each seed's own"
        extra += f", {warm} warm-up"
    print(
        f"\n{args.seeds} seeds x {len(args.masks)} masks, {args.steps} steps each, {task}"
        f" after {args.warmup} answer warm-up steps,"
        f" staleness {args.staleness},"
        f" {args.rollout_dtype} rollouts,"
        f" {args.minibatches}"
        f" minibatches, lr {args.lr}{extra}, {args.engine} engine;"
        f" total {time.perf_counter() - t0:.0f}s\n"
    )
    order = [name for name in VARIANTS if name in runs]
    baseline = args.baseline if args.baseline in runs else order[0]
    rep = report(runs, baseline=baseline, threshold=args.threshold, arm_order=order)
    times = report(runs, metric="step_time", baseline=baseline, final_fraction=1.0, arm_order=order)
    (args.out / "report.json").write_text(json.dumps(rep, indent=1))
    (args.out / "report.csv").write_text(report_csv(rep))
    print(summary_table(rep, times))
    print()
    print(paired_table(rep))
    if args.primary:
        print()
        print(held_out(runs, baseline, args.primary))
    png = args.out / "reward_curves.png"
    plot(runs, png, args.primary)
    print(f"\nreward curves: {png}")


if __name__ == "__main__":
    main()
