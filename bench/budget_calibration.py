"""Calibrate `core.budget`'s memory estimate against the peak RSS of one real training step.

For tiny-model specs of increasing size, each run starts a fresh child process that imports the
trainer, records its RSS, runs one training step (rollout, update, checkpoint, final model) and
reports its peak RSS (VmHWM, `_peak_rss_bytes`); the job's measured memory is that
peak minus the RSS after the imports. The estimate must be an upper bound, and not a wild one:

    python bench/budget_calibration.py            # the table (a few minutes on 2 cores)
    python bench/budget_calibration.py --only 0,3  # some rows

Prints one row per spec: parameters, tokens per step, estimate, measured, estimate / measured.
Exit status 1 when a row is under 1 (the estimate was not an upper bound).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _tiny(d: int, layers: int, heads: int, seq: int) -> dict[str, Any]:
    return {"name": "builtin:tiny", "tiny": {"d_model": d, "n_layers": layers, "n_heads": heads,
                                             "max_seq_len": seq}}  # fmt: skip


# (label, train config): increasing model size, batch and sequence; then the knobs that add
# memory of their own (exact estimator, bf16 rollout copy with stale snapshots, minibatches).
SPECS: list[tuple[str, dict[str, Any]]] = [
    (
        "smoke d32 L1 16x17",
        {
            "model": _tiny(32, 1, 2, 32),
            "task": {"name": "reverse", "min_len": 2, "max_len": 3},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
            "algorithm": {"top_k": 8},
        },
    ),
    ("default d64 L2 128x21", {}),
    (
        "d128 L4 256x42",
        {
            "model": _tiny(128, 4, 4, 128),
            "task": {"name": "reverse", "min_len": 8, "max_len": 8},
            "rollout": {"prompts_per_step": 32, "group_size": 8, "max_new_tokens": 24},
        },
    ),
    (
        "d256 L4 512x50",
        {
            "model": _tiny(256, 4, 8, 128),
            "task": {"name": "reverse", "min_len": 8, "max_len": 8},
            "rollout": {"prompts_per_step": 64, "group_size": 8, "max_new_tokens": 32},
        },
    ),
    (
        "d64 L2 1024x58",
        {
            "task": {"name": "reverse", "min_len": 16, "max_len": 16},
            "rollout": {"prompts_per_step": 64, "group_size": 16, "max_new_tokens": 32},
        },
    ),
    (
        "d512 L8 32x21 (weights)",
        {
            "model": _tiny(512, 8, 8, 128),
            "rollout": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 8},
        },
    ),
    (
        "d128 L2 512x40 exact",
        {
            "model": _tiny(128, 2, 4, 128),
            "task": {"name": "reverse", "min_len": 8, "max_len": 8},
            "rollout": {"prompts_per_step": 64, "group_size": 8, "max_new_tokens": 22},
            "algorithm": {"estimator": "exact"},
        },
    ),
    (
        "d256 L4 256x42 bf16 stale=2 mb=4",
        {
            "model": _tiny(256, 4, 8, 128),
            "task": {"name": "arithmetic", "min_len": 4, "max_len": 8},
            "rollout": {
                "prompts_per_step": 32,
                "group_size": 8,
                "max_new_tokens": 16,
                "dtype": "bfloat16",
                "staleness": 2,
            },
            "algorithm": {"minibatches": 4},
        },
    ),
]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM, of its memory since its exec). Not getrusage's
    ru_maxrss: Linux carries into it the peak of the memory that exec replaced, which for a
    child started with vfork (Python's subprocess) is its parent's: a child of a test worker
    that had grown to 700 MiB reported 480 MiB for a step that takes 120."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(config_json: str) -> None:
    """In a fresh process: import, note the RSS, run one step, report the peak above it."""
    import torch

    from core.config import TrainConfig
    from core.training.trainer import train

    torch.set_num_threads(1)
    cfg = TrainConfig.model_validate(json.loads(config_json))
    base = _rss_bytes()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        train(cfg, Path(out))
    peak = _peak_rss_bytes()
    print(json.dumps({"base": base, "peak": peak, "seconds": time.perf_counter() - t0}))


def config_for(overrides: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {"steps": 1, "checkpoint_every": 0, "device": "cpu", "seed": 0}
    return {**base, **overrides}


def main() -> int:
    from core.budget import estimate, format_bytes, format_count
    from core.config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated row indices")
    args = parser.parse_args()
    rows = range(len(SPECS))
    if args.only:
        rows = [int(i) for i in args.only.split(",")]  # type: ignore[assignment]
    header = (
        f"{'spec':<34} {'params':>7} {'tok/step':>8} {'estimate':>10} {'measured':>10} "
        f"{'ratio':>6}  largest items of the estimate"
    )
    print(header)
    print("-" * len(header))
    worst = float("inf")
    for i in rows:
        label, overrides = SPECS[i]
        config = config_for(overrides)
        budget = estimate(TrainConfig.model_validate(config), queue="cpu")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(config)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            print(f"{label}: child failed\n{proc.stderr[-2000:]}")
            return 2
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        measured = got["peak"] - got["base"]
        assert budget.peak_memory_bytes is not None and budget.params is not None
        ratio = budget.peak_memory_bytes / max(measured, 1)
        worst = min(worst, ratio)
        items = sorted(
            (m for m in budget.at_peak() if m.phase != "overhead"), key=lambda m: -m.bytes
        )
        print(
            f"{label:<34} {format_count(budget.params):>7} "
            f"{format_count(budget.tokens_per_step):>8} "
            f"{format_bytes(budget.peak_memory_bytes):>10} {format_bytes(measured):>10} "
            f"{ratio:>6.2f}  " + ", ".join(f"{m.name} {format_bytes(m.bytes)}" for m in items[:2])
        )
        sys.stdout.flush()
    return 0 if worst >= 1 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        sys.exit(main())
