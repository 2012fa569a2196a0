"""Does the chat example learn? `examples/chat_math.yaml`, run as shipped for several seeds.

For each seed: the warm-up (supervised, on the training answers), then the RL steps, with the
held-out set (`examples/data/chat_math_val.jsonl`, 50 questions the run never trains on)
evaluated before the first RL step (`eval_on_start`, the warm-up's model) and after the last.
Prints, per seed and as a median, the training reward and exact-answer share (means of the first
and last `--window` RL steps) and the held-out reward, exact share and greedy reward before and
after RL. The gain that matters is the held-out one: the training numbers also move when the
policy only sharpens on questions it has seen.

    python examples/build_chat_model.py        # once: the locally built chat Llama
    python bench/chat_example.py --seeds 3 --out runs/bench-chat

Runs the seeds in parallel processes (`--workers`, one torch thread each); the spec's steps,
warm-up and knobs are the shipped ones unless `--steps` or `--eval-samples` override them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.seed_runs import add_seed_options, read_rows, run_seeds  # noqa: E402  (after the path above)

SPEC = ROOT / "examples" / "chat_math.yaml"


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(float(r.get(key, 0.0)) for r in rows) if rows else float("nan")


def run_seed(seed: int, out: Path, steps: int | None, eval_samples: int) -> dict[str, Any]:
    """One seed of the shipped spec; returns its summary (also written to `out/summary.json`)."""
    import torch

    from core.training.trainer import train
    from pdppo.spec import load_spec

    torch.set_num_threads(1)
    spec = load_spec(SPEC)
    updates: dict[str, Any] = {
        "seed": seed,
        "eval_on_start": True,
        "eval_samples": eval_samples,
        "log_samples_every": 0,
        "checkpoint_every": 0,
    }
    if steps is not None:
        updates["steps"] = steps
    cfg = spec.train.model_copy(update=updates)
    cfg = type(cfg).model_validate(cfg.model_dump())  # re-validated with the overrides
    out.mkdir(parents=True, exist_ok=True)
    train(cfg, out)
    metrics = read_rows(out / "metrics.jsonl")
    evals = {int(r["step"]): r for r in read_rows(out / "eval.jsonl")}
    first, last = evals[0], evals[max(evals)]
    summary = {
        "seed": seed,
        "steps": len(metrics),
        "metrics": metrics,
        "eval_first": first,
        "eval_last": last,
    }
    (out / "summary.json").write_text(json.dumps(summary))
    return summary


def _line(label: str, before: float, after: float) -> str:
    return f"{label:<34} {before:7.3f} -> {after:7.3f}  ({after - before:+.3f})"


def report(summaries: list[dict[str, Any]], window: int) -> None:
    rows: dict[str, list[tuple[float, float]]] = {}
    for s in summaries:
        m = s["metrics"]
        head, tail = m[:window], m[-window:]
        first, last = s["eval_first"], s["eval_last"]
        pairs = {
            f"train reward_mean (first/last {window})": (
                _mean(head, "reward_mean"),
                _mean(tail, "reward_mean"),
            ),
            f"train exact share (first/last {window})": (
                _mean(head, "grader/answer"),
                _mean(tail, "grader/answer"),
            ),
            "held-out eval_reward_mean": (first["eval_reward_mean"], last["eval_reward_mean"]),
            "held-out exact share (sampled)": (
                first.get("eval_grader/answer", float("nan")),
                last.get("eval_grader/answer", float("nan")),
            ),
            "held-out greedy reward": (
                first.get("eval_greedy_reward_mean", float("nan")),
                last.get("eval_greedy_reward_mean", float("nan")),
            ),
        }
        print(f"\nseed {s['seed']} ({s['steps']} RL steps, eval at steps 0 and {last['step']})")
        for label, (before, after) in pairs.items():
            print("  " + _line(label, before, after))
            rows.setdefault(label, []).append((before, after))
    print(f"\nmedian over {len(summaries)} seeds (gain: median of per-seed gains)")
    for label, values in rows.items():
        before = statistics.median(v[0] for v in values)
        after = statistics.median(v[1] for v in values)
        gains = [v[1] - v[0] for v in values]
        positive = sum(g > 0 for g in gains)
        print(
            f"  {label:<34} {before:7.3f} -> {after:7.3f}  gain {statistics.median(gains):+.3f}"
            f"  (up in {positive}/{len(gains)} seeds)"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_seed_options(p, seeds=3, out=ROOT / "runs" / "bench-chat")
    p.add_argument("--eval-samples", type=int, default=4, help="sampled answers per question")
    p.add_argument("--window", type=int, default=5, help="steps averaged at each end")
    args = p.parse_args(argv)
    summaries = run_seeds(run_seed, args, extra=(args.eval_samples,))
    if summaries is None:
        return 2
    report(summaries, args.window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
