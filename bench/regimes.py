"""Where does uncorrected training break? Regimes of growing off-policy mismatch, walked one axis
at a time, with the collapse rate of each arm (issue 52, item 2).

The uncorrected arm is `algorithm.mask: none` with the default `is_cap` (1e4): its loss is
`-A * sg(pi/mu) * log pi(a)` on every token, the importance weight with no mask and (at 1e4) no
cap, so nothing limits how far a stale or low-precision sample pulls the policy.

Collapse, fixed before any run of this bench (in the commit that added this definition, ahead of
the code that runs it). A run collapses when

1. any step's metrics are not finite (the trainer stops such a run with FloatingPointError), or
2. its reward at the end is below its reward at the start by more than `COLLAPSE_MARGIN` (0.05,
   rewards lie in [0, 1]):
   - chat-math: the held-out reward after the last step (`eval_reward_mean`) against the
     held-out reward of the same policy before the first RL step (`start_eval_reward_mean`,
     after the supervised warm-up), both over the 50 held-out questions x `--eval-samples`;
   - reverse (builtin:tiny, which has no held-out set): the training reward, the mean of the
     last 10% of steps, against the first step's (the policy right after its warm-up, 128
     samples).

A regime breaks the uncorrected run when at least half of its seeds collapse. Why 0.05: the
held-out reward of one policy is a mean of 800 graded samples (50 x 16), whose standard error is
about 0.01, and in the 16-seed run where nothing was stressed the seeds' final held-out rewards
spread over 0.284-0.354 (bench/results/masks-chat-math-e518c19.txt); a drop of 0.05 below the
run's own start is then no sampling accident but training that made the policy worse.

    python bench/regimes.py --setting chat-math --seeds 4 --steps 40 --workers 2 \
        --shared-warmup --stop-at-break --out runs/regimes-chat-math

walks the regimes (`PATH`, or `--regimes`) until the uncorrected arm breaks; `--first-seed 4
--add-runs <the walk's regimes.json> --warmup-seed 0` then adds seeds to a regime's table.
The runs and what they found: bench/results/regimes-*.txt.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bench.masks import (
    COLLAPSE_MARGIN,
    VARIANTS,
    add_warmup_seed,
    base_config,
    collapsed,
    run_one,
    warm_up_seeds,
)
from core.objective.loss import PolicyLossOutput
from core.objective.masks import TrustRegion, far_from_behavior, ratio_moves_away

FINAL_FRACTION = 0.1
"""The training reward's end value (reverse): the mean of this last share of the steps."""


def start_and_end(rows: Sequence[dict[str, float]], held_out: bool) -> tuple[float, float]:
    """The start and end reward of a run's metrics rows: the held-out evaluations before the
    first step and after the last (`held_out`, chat-math, rows joined as bench/masks.py does),
    or the first step's training reward and the mean of the last `FINAL_FRACTION` of steps."""
    if not rows:
        return math.nan, math.nan
    if held_out:
        return rows[0].get("start_eval_reward_mean", math.nan), rows[-1].get(
            "eval_reward_mean", math.nan
        )
    last = max(1, round(len(rows) * FINAL_FRACTION))
    tail = [r["reward_mean"] for r in rows[-last:]]
    return rows[0]["reward_mean"], sum(tail) / len(tail)


LR_STEPS = {"x1": 1.0, "x3.3": 10 / 3, "x10": 10.0}
"""Learning rates as multiples of the setting's default (chat-math 3e-4: 3e-4, 1e-3, 3e-3;
reverse 3e-3: 3e-3, 1e-2, 3e-2)."""

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Regime:
    """How far from on-policy a run's updates are: rollouts `staleness` steps old, sampled by a
    `dtype` copy of the policy (DTYPES' short name) against the fp32 trainer, `minibatches`
    optimizer steps per rollout batch, at the setting's learning rate times LR_STEPS[`lr`]."""

    staleness: int
    minibatches: int
    dtype: str
    lr: str

    @property
    def name(self) -> str:
        return f"s{self.staleness}-mb{self.minibatches}-{self.dtype}-lr{self.lr}"


PATH: tuple[Regime, ...] = (
    Regime(0, 1, "fp32", "x1"),
    Regime(4, 1, "fp32", "x1"),
    Regime(4, 4, "fp32", "x1"),
    Regime(4, 4, "bf16", "x1"),
    Regime(4, 4, "bf16", "x3.3"),
    Regime(4, 4, "bf16", "x10"),
    Regime(8, 8, "fp16", "x10"),
)
"""From on-policy (the mildest) to the harshest corner of the grid, one axis harsher per regime
(staleness, minibatches, rollout dtype, learning rate twice, then everything at its worst):
`--stop-at-break` walks it until the uncorrected arm breaks."""


def parse_regime(name: str) -> Regime:
    """The regime `Regime.name` names (`s4-mb4-bf16-lrx3.3`): any point of the grid, on the
    path or not."""
    m = re.fullmatch(r"s(\d+)-mb(\d+)-(\w+?)-lr(x[\d.]+)", name)
    if m is None or m[3] not in DTYPES or m[4] not in LR_STEPS:
        raise argparse.ArgumentTypeError(
            f"{name!r} is no regime: s<staleness>-mb<minibatches>-<{'|'.join(DTYPES)}>-"
            f"lr<{'|'.join(LR_STEPS)}>"
        )
    return Regime(int(m[1]), int(m[2]), m[3], m[4])


ARMS: dict[str, dict[str, Any]] = {
    "none": VARIANTS["none"],
    "dppo topK-TV": VARIANTS["dppo topK-TV"],
    "dppo binary-TV": VARIANTS["dppo binary-TV"],
    "predictive topK-TV": VARIANTS["predictive topK-TV"],
    "ppo_clip": VARIANTS["ppo_clip"],
    "tis": VARIANTS["tis"],
    "icepop": VARIANTS["icepop"],
    "dppo topK-TV + tis": VARIANTS["dppo topK-TV + tis"],
}
"""The arms, each an `algorithm` section merged over the setting's (bench/masks.py's VARIANTS);
a new correction (TIS, IcePop, ...) is one more entry. The first is the uncorrected run."""

UNCORRECTED = "none"


def step_figures(log_ratio: Tensor, mu_logprob: Tensor, advantages: Tensor) -> dict[str, float]:
    """How far one step's tokens were from on-policy, each measured by the pass that trained on
    it: the mean, standard deviation and 1st/99th percentiles of log pi(a)/mu(a), and the share
    of the tokens that PPO's clip (eps 0.2) and DPPO's binary-TV mask (delta 0.15) would drop,
    whatever the run's own mask (all (N,) over the step's response tokens)."""
    lr = log_ratio.double()
    lo, hi = torch.quantile(lr, torch.tensor([0.01, 0.99], dtype=torch.float64)).tolist()
    ratio = lr.exp()
    pos, neg = advantages > 0, advantages < 0
    clip = (pos & (ratio > 1.2)) | (neg & (ratio < 0.8))
    mu = mu_logprob.double().exp()
    tv = ((mu_logprob.double() + lr).exp() - mu).abs()  # binary TV: |pi(a) - mu(a)|
    dppo = far_from_behavior(tv, advantages, DPPO_BINARY) & ratio_moves_away(lr, advantages)
    return {
        "log_ratio_mean": float(lr.mean()),
        "log_ratio_std": float(lr.std()) if lr.numel() > 1 else 0.0,
        "log_ratio_p01": lo,
        "log_ratio_p99": hi,
        "would_clip_ppo": float(clip.double().mean()),
        "would_mask_dppo_binary": float(dppo.double().mean()),
    }


DPPO_BINARY = TrustRegion(mask="dppo", estimator="binary")


def run_measured(
    job: tuple[str, str, int, dict[str, Any], str],
) -> tuple[str, str, int, list[dict[str, float]], str | None]:
    """One run (bench/masks.py's `run_one`), with `step_figures` added to each step's metrics
    row. The trainer's metrics hold the mean |log ratio| and the mean ratio, not their spread;
    the figures come from the log ratios the loss itself computed, recorded by wrapping the
    update's `policy_loss` in this worker process, so the trainer's metrics (pinned value for
    value by tests/core/test_fixed_seed_metrics.py) stay as they are. A run the trainer stops
    on non-finite metrics returns the rows it wrote and the error."""
    from core.training import update

    regime, name, seed, cfg, out = job
    pieces: list[tuple[Tensor, Tensor, Tensor]] = []
    original = update.policy_loss

    def recording(**kwargs: Any) -> PolicyLossOutput:
        result = original(**kwargs)
        pieces.append(
            (result.log_ratio, kwargs["behavior"].token_logprobs, kwargs["advantages"].float())
        )
        return result

    update.policy_loss = recording  # type: ignore[assignment]
    error = None
    try:
        _, _, rows = run_one((name, seed, cfg, out))
    except FloatingPointError as exc:
        error = str(exc)
        metrics = Path(out) / name.replace(" ", "_") / f"seed{seed}" / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    finally:
        update.policy_loss = original
    per_step = cfg["algorithm"]["minibatches"]
    if error is None and len(pieces) != per_step * len(rows):
        raise RuntimeError(
            f"recorded {len(pieces)} loss pieces for {len(rows)} steps of {per_step} "
            "minibatches: the update no longer calls policy_loss once per minibatch"
        )
    for i, row in enumerate(rows):
        step = pieces[i * per_step : (i + 1) * per_step]
        if step:
            row.update(step_figures(*(torch.cat(t) for t in zip(*step, strict=True))))
    return regime, name, seed, rows, error


FIGURES = (
    "log_ratio_mean",
    "log_ratio_std",
    "log_ratio_p01",
    "log_ratio_p99",
    "offpolicy_logratio_abs",
    "masked_fraction",
    "would_clip_ppo",
    "would_mask_dppo_binary",
)
"""The mismatch figures of a run, each its mean over the steps (`step_figures` and the
trainer's own `offpolicy_logratio_abs` and `masked_fraction`, the run's mask's share)."""


def run_summary(rows: Sequence[dict[str, float]], held_out: bool, error: str | None) -> dict:
    """A run's start and end reward, whether it collapsed, and its mismatch figures."""
    start, end = start_and_end(rows, held_out)
    out: dict[str, Any] = {
        "start": start,
        "end": end,
        "collapsed": error is not None or collapsed(start, end),
        "error": error,
        "steps": len(rows),
    }
    for key in FIGURES:
        values = [r[key] for r in rows if key in r]
        out[key] = sum(values) / len(values) if values else math.nan
    return out


def median(values: Sequence[float]) -> float:
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return math.nan
    mid = len(finite) // 2
    return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2


def arm_row(regime: str, arm: str, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One line of the regime table: the arm's collapse count over its seeds, the median
    (min, max) of end - start, and the median over seeds of every mismatch figure."""
    deltas = [r["end"] - r["start"] for r in runs]
    finite = [d for d in deltas if math.isfinite(d)]
    row: dict[str, Any] = {
        "regime": regime,
        "arm": arm,
        "seeds": len(runs),
        "collapsed": sum(bool(r["collapsed"]) for r in runs),
        "start_median": median([r["start"] for r in runs]),
        "delta_median": median(deltas),
        "delta_min": min(finite) if finite else math.nan,
        "delta_max": max(finite) if finite else math.nan,
    }
    row.update({key: median([r[key] for r in runs]) for key in FIGURES})
    return row


def breaks(row: dict[str, Any]) -> bool:
    """Whether the arm collapsed on at least half of its seeds."""
    return row["seeds"] > 0 and 2 * row["collapsed"] >= row["seeds"]


COLUMNS = (
    ("regime", 24, "{}"),
    ("arm", 20, "{}"),
    ("collapsed", 10, "{}"),
    ("start", 7, "{:.3f}"),
    ("end-start [min,max]", 26, "{}"),
    ("lr mean", 9, "{:+.4f}"),
    ("lr std", 8, "{:.4f}"),
    ("lr p01", 9, "{:+.3f}"),
    ("lr p99", 8, "{:+.3f}"),
    ("|lr|", 8, "{:.4f}"),
    ("masked", 8, "{:.4f}"),
    ("ppo>clip", 9, "{:.4f}"),
    ("dppo-bin", 9, "{:.4f}"),
)


def regime_table(rows: Sequence[dict[str, Any]]) -> str:
    """The regime table: per regime and arm (`arm_row`s), the collapse count, the start reward
    and end - start (median [min, max] over seeds), and the mismatch figures: the log ratio
    log pi/mu's mean, std, p01 and p99, its mean absolute value (the trainer's
    offpolicy_logratio_abs), the arm's own masked fraction, and the shares PPO's clip and DPPO's
    binary-TV mask would drop of the arm's tokens."""
    head = "".join(
        (f"{name:<{width}}" if i < 2 else f"{name:>{width}}")
        for i, (name, width, _) in enumerate(COLUMNS)
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        delta = (
            f"{row['delta_median']:+.3f} [{row['delta_min']:+.3f},{row['delta_max']:+.3f}]"
            if math.isfinite(row["delta_median"])
            else "nan"
        )
        cells = [
            row["regime"],
            row["arm"],
            f"{row['collapsed']}/{row['seeds']}" + ("*" if breaks(row) else ""),
            row["start_median"],
            delta,
            *(row[key] for key in FIGURES),
        ]
        text = []
        for i, ((_, width, fmt), cell) in enumerate(zip(COLUMNS, cells, strict=True)):
            txt = cell if isinstance(cell, str) else fmt.format(cell)
            text.append(f"{txt:<{width}}" if i < 2 else f"{txt:>{width}}")
        lines.append("".join(text))
    return "\n".join(lines)


def earlier_runs(
    paths: Sequence[Path], regime: str, arms: Sequence[str], seeds: range
) -> list[dict[str, Any]]:
    """The runs of `regime` and `arms` in earlier regimes.json files (`--add-runs`), less the
    seeds this invocation runs itself; a seed in two files counts once (the first)."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for path in paths:
        for run in json.loads(path.read_text())["runs"]:
            key = (run["arm"], run["seed"])
            if run["regime"] == regime and run["arm"] in arms and run["seed"] not in seeds:
                found.setdefault(key, run)
    return list(found.values())


def regime_args(args: argparse.Namespace, regime: Regime) -> argparse.Namespace:
    """bench/masks.py's arguments for `regime`: its staleness, minibatches, rollout dtype and
    learning rate over the setting's."""
    ns = argparse.Namespace(**vars(args))
    ns.staleness, ns.minibatches = regime.staleness, regime.minibatches
    ns.rollout_dtype = DTYPES[regime.dtype]
    ns.lr = args.lr * LR_STEPS[regime.lr]
    return ns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--setting", default="chat-math", choices=["chat-math", "reverse"])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=None, help="default 400 (chat-math), 50")
    p.add_argument("--lr", type=float, default=None, help="x1: default 3e-4 (chat-math), 3e-3")
    p.add_argument("--eval-samples", type=int, default=16, help="chat-math: per question")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--arms", nargs="*", default=[UNCORRECTED, "dppo topK-TV"], choices=ARMS)
    p.add_argument(
        "--regimes",
        nargs="*",
        type=parse_regime,
        default=list(PATH),
        help="regime names, s<staleness>-mb<minibatches>-<fp32|bf16|fp16>-lr<x1|x3.3|x10> "
        f"(default the path: {' '.join(r.name for r in PATH)})",
    )
    p.add_argument(
        "--stop-at-break",
        action="store_true",
        help="stop after the first regime that breaks the uncorrected arm",
    )
    p.add_argument(
        "--shared-warmup",
        action="store_true",
        help="chat-math: the first seed's warm-up for every seed",
    )
    add_warmup_seed(p)
    p.add_argument("--out", type=Path, default=Path("runs/bench-regimes"))
    p.add_argument(
        "--add-runs",
        type=Path,
        nargs="*",
        default=[],
        help="earlier regimes.json files whose runs of the same regimes and arms (other seeds) "
        "join this run's table: 4 more seeds on top of a 4-seed walk make an 8-seed table",
    )
    args = p.parse_args()
    chat = args.setting == "chat-math"
    args.warmup = args.warmup if args.warmup is not None else (400 if chat else 50)
    args.lr = args.lr if args.lr is not None else (3e-4 if chat else 3e-3)
    args.warmup_seed = args.first_seed if args.warmup_seed is None else args.warmup_seed
    # bench/masks.py's settings, fixed here: the hf engine, the TV kind at DPPO's delta; the
    # warm-up's config is the chat setting's on-policy one (it overrides staleness itself)
    args.engine, args.kind, args.delta, args.rollout_dtype = "hf", "tv", 0.15, "float32"
    args.staleness, args.minibatches = 0, 1
    args.out = args.out.resolve()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    t0 = time.perf_counter()
    if chat:
        from core.models.local_hf import make_chat_hf

        args.model = args.out / "model"
        if not (args.model / "config.json").exists():
            make_chat_hf(args.model)
        warm_up_seeds(args, seeds)
    table: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for regime in args.regimes:
        t_regime = time.perf_counter()
        ns = regime_args(args, regime)
        out = str(args.out / regime.name)
        jobs = [
            (regime.name, arm, seed, base_config(ns, seed, ARMS[arm]), out)
            for seed in seeds
            for arm in args.arms
        ]
        done: dict[str, list[dict[str, Any]]] = {}
        for earlier in earlier_runs(args.add_runs, regime.name, args.arms, seeds):
            runs.append(earlier)
            done.setdefault(earlier["arm"], []).append(earlier)
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            for name, arm, seed, rows, error in pool.map(run_measured, jobs):
                summary = {"regime": name, "arm": arm, "seed": seed}
                summary.update(run_summary(rows, chat, error))
                runs.append(summary)
                done.setdefault(arm, []).append(summary)
                print(
                    f"  {name} {arm} seed {seed}: start {summary['start']:.3f} end "
                    f"{summary['end']:.3f}{' COLLAPSED' if summary['collapsed'] else ''}"
                    f"{' (' + error + ')' if error else ''}",
                    flush=True,
                )
        rows_here = [arm_row(regime.name, arm, done[arm]) for arm in args.arms]
        table.extend(rows_here)
        print(
            f"\n{regime.name}: {time.perf_counter() - t_regime:.0f}s\n{regime_table(rows_here)}\n",
            flush=True,
        )
        uncorrected = next((r for r in rows_here if r["arm"] == UNCORRECTED), None)
        if args.stop_at_break and uncorrected is not None and breaks(uncorrected):
            print(f"{regime.name} breaks the uncorrected arm: stopping the walk\n")
            break
    task = "chat-math (examples/chat_math.yaml, held-out reward)" if chat else "reverse-3"
    print(
        f"{args.seeds} seeds x {len(args.arms)} arms, {args.steps} steps, {task} after "
        f"{args.warmup} warm-up steps, lr x1 = {args.lr}, tv delta 0.15, hf engine; "
        f"total {time.perf_counter() - t0:.0f}s"
        + "".join(f"; with the other seeds of {path}" for path in args.add_runs)
        + "\n"
        f"collapse: end reward more than {COLLAPSE_MARGIN} below the start, or non-finite; "
        "'*': collapsed on at least half the seeds\n"
    )
    print(regime_table(table))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "regimes.json").write_text(json.dumps({"table": table, "runs": runs}, indent=1))
    with (args.out / "regimes.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["regime"])
        writer.writeheader()
        writer.writerows(table)
    print(f"\n{args.out / 'regimes.json'}, {args.out / 'regimes.csv'}")


if __name__ == "__main__":
    main()
