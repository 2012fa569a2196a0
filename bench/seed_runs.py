"""What the example benches share (`bench/chat_example.py`, `bench/reasoning_gym_example.py`):
a shipped spec on the locally built chat model, one process per seed, so that seeds run side by
side on a few cores (each process sets one torch thread itself)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
CHAT_MODEL = ROOT / "examples" / "models" / "chat-llama"

T = TypeVar("T")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A run's metrics.jsonl or eval.jsonl."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def add_seed_options(p: argparse.ArgumentParser, seeds: int, out: Path) -> None:
    """--seeds, --first-seed, --steps, --workers and --out, which `run_seeds` reads."""
    p.add_argument("--seeds", type=int, default=seeds)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="RL steps (default: the spec's)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=out)


def run_seeds(
    run_seed: Callable[..., T], args: argparse.Namespace, extra: tuple[Any, ...] = ()
) -> list[T] | None:
    """`run_seed(seed, args.out / f"seed-{seed}", args.steps, *extra)` for each seed of the
    `add_seed_options` options, in `args.workers` processes, in seed order; None, having said
    how to build it, when the chat model is not built yet (the benches' exit 2)."""
    if not (CHAT_MODEL / "config.json").exists():
        print(f"no model at {CHAT_MODEL}: run `python examples/build_chat_model.py` first")
        return None
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [
            pool.submit(run_seed, s, args.out / f"seed-{s}", args.steps, *extra) for s in seeds
        ]
        return [f.result() for f in futures]
