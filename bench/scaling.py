"""Step time and throughput of one job on 1 and N data-parallel processes (`pdppo train --nproc`),
replicated and sharded (`train.sharding: fsdp`).

The same spec runs with --nproc 1, --nproc N, and --nproc N sharded, interleaved (1, N, N fsdp,
1, N, N fsdp, ...: `--rounds` rounds), so that a machine whose load drifts during the bench slows
every configuration alike instead of whichever ran last. Every run is pinned to the same cores
(`--cores`: sched_setaffinity, inherited by its ranks) with cores / processes torch threads each
(PDPPO_JOB_THREADS, as `pdppo train --nproc` would choose), so the comparison is one process with
all those cores against N processes with a share each (torch's intra-op threads against data
parallelism), not free extra hardware, and not N processes each spinning a thread per core.

Printed per configuration: over its runs, the median of each run's median step time (steps after
`--warmup`), the spread (lowest and highest run), median rollout and update time and tokens/s
(response tokens of the whole batch over the step's wall time); and its speedup against one
process, the median and spread of the ratios within each round (runs side by side in time).

`--engine vllm` (in a virtualenv with the `vllm` extra) samples with vLLM instead, an engine per
process: the chat example's Llama shape (built locally, heads of 64 for vLLM's CPU kernels) on
its arithmetic records, 1 and N processes, replicated.

    python bench/scaling.py [--nproc 2] [--steps 12] [--warmup 2] [--prompts 16] [--group 8]
                            [--rounds 5] [--cores 0,1]
    python bench/scaling.py --engine vllm
    python bench/scaling.py --steps 2 --warmup 1 --prompts 4 --group 2 --rounds 2   # a check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def spec(args: argparse.Namespace, sharding: str, root: Path) -> dict[str, object]:
    """A model large enough that a step is mostly compute: builtin:tiny at d_model 256; with
    vLLM a Hugging Face Llama of the chat example's shape."""
    if args.engine == "vllm":
        return vllm_spec(args, root)
    return {
        "name": "scaling",
        "train": {
            "model": {
                "name": "builtin:tiny",
                "tiny": {"d_model": 256, "n_layers": 4, "n_heads": 4, "max_seq_len": 64},
            },
            "task": {"name": "reverse", "min_len": 3, "max_len": 6},
            "rollout": {
                "prompts_per_step": args.prompts,
                "group_size": args.group,
                "max_new_tokens": 16,
            },
            "algorithm": {"top_k": 16},
            "steps": args.steps,
            "checkpoint_every": 0,
            "seed": 0,
            "device": "cpu",
            "sharding": sharding,
        },
    }


def vllm_spec(args: argparse.Namespace, root: Path) -> dict[str, object]:
    from core.models.local_hf import make_chat_hf

    model = root / "chat-llama"
    if not model.exists():
        make_chat_hf(model)
    return {
        "name": "scaling-vllm",
        "train": {
            "model": {"name": f"hf:{model}"},
            "task": {
                "name": "jsonl",
                "path": str(REPO / "examples" / "data" / "chat_math.jsonl"),
                "grader": {"type": "numeric", "tolerance": 20.0},
            },
            "rollout": {
                "engine": "vllm",
                "vllm_memory": 0.05,
                "prompts_per_step": args.prompts,
                "group_size": args.group,
                "max_new_tokens": 16,
            },
            "algorithm": {"top_k": 8},
            "steps": args.steps,
            "checkpoint_every": 0,
            "seed": 0,
            "device": "cpu",
        },
    }


@dataclass(frozen=True)
class Config:
    nproc: int
    sharding: str  # replicate | fsdp

    @property
    def label(self) -> str:
        return f"--nproc {self.nproc}" + (" fsdp" if self.sharding == "fsdp" else "")


@dataclass(frozen=True)
class Run:
    step: float  # median step time over the timed steps, seconds
    rollout: float
    update: float
    tokens_per_s: float
    wall: float


def interleaved(configs: list[Config], rounds: int) -> list[tuple[int, Config]]:
    """(round, config) in the order they run: every configuration once per round."""
    return [(r, config) for r in range(rounds) for config in configs]


def parse_cores(raw: str | None, available: set[int]) -> list[int]:
    """`--cores`: a count (the first cores this process may use: "2"), or core ids with a comma
    ("0,1", or "3," for core 3 alone); default: every core this process may use."""
    if raw is None:
        return sorted(available)
    if "," not in raw:
        count = int(raw)
        if not 1 <= count <= len(available):
            raise SystemExit(f"--cores {raw}: between 1 and {len(available)} cores")
        return sorted(available)[:count]
    chosen = sorted({int(c) for c in raw.split(",") if c.strip()})
    missing = set(chosen) - available
    if missing or not chosen:
        raise SystemExit(f"--cores {raw}: this process may not run on {sorted(missing)}")
    return chosen


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def run(spec_path: Path, out: Path, nproc: int, cores: list[int], warmup: int, batch: int) -> Run:
    threads = max(len(cores) // nproc, 1)
    env = {**os.environ, "PDPPO_JOB_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "from pdppo.cli import main; main()", "train", str(spec_path),
         "--out", str(out), "--nproc", str(nproc), "--quiet"],
        env=env, cwd=REPO, capture_output=True, text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),  # the ranks inherit it
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"pdppo train --nproc {nproc} failed:\n{done.stderr[-3000:]}")
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = rows[warmup:] or rows
    step = statistics.median(r["step_time"] for r in timed)
    tokens = statistics.median(r["response_len"] * batch for r in timed)
    return Run(
        step=step,
        rollout=statistics.median(r["rollout_time"] for r in timed),
        update=statistics.median(r["update_time"] for r in timed),
        tokens_per_s=tokens / step,
        wall=wall,
    )


def report(configs: list[Config], runs: dict[tuple[int, Config], Run], rounds: int) -> list[str]:
    """One line per configuration: medians over its runs and their spread; the speedup against
    the first configuration, paired within each round."""
    lines = []
    base = configs[0]
    for config in configs:
        mine = [runs[(r, config)] for r in range(rounds)]
        steps = [m.step for m in mine]
        line = (
            f"{config.label}: step {statistics.median(steps):.3f} s (runs {spread(steps)}; "
            f"rollout {statistics.median(m.rollout for m in mine):.3f}, "
            f"update {statistics.median(m.update for m in mine):.3f}), "
            f"{statistics.median(m.tokens_per_s for m in mine):.0f} tokens/s"
        )
        if config != base:
            ratios = [
                runs[(r, config)].tokens_per_s / runs[(r, base)].tokens_per_s for r in range(rounds)
            ]
            line += f", x{statistics.median(ratios):.2f} of one process (rounds {spread(ratios)})"
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--cores", default=None, help="core ids (0,1) or a count; default: all this process has"
    )
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    args = parser.parse_args()
    cores = parse_cores(args.cores, os.sched_getaffinity(0))
    root = Path(tempfile.mkdtemp(prefix="pdppo-scaling-"))
    model = "builtin:tiny d_model 256 x 4 layers,"
    if args.engine == "vllm":
        model = "hf chat Llama (hidden 128, 2 layers), vLLM rollouts,"
    configs = [Config(1, "replicate"), Config(args.nproc, "replicate")]
    if args.engine != "vllm":
        configs.append(Config(args.nproc, "fsdp"))
    print(
        f"{model} {args.prompts} prompts x {args.group} per step, up to 16 new tokens, "
        f"{args.steps} steps ({args.warmup} warm-up); every run on cores "
        f"{','.join(map(str, cores))} with {len(cores)} / processes threads each; "
        f"{args.rounds} rounds of {', '.join(c.label for c in configs)}, interleaved"
    )
    runs: dict[tuple[int, Config], Run] = {}
    for r, config in interleaved(configs, args.rounds):
        spec_path = root / f"{config.sharding}.yaml"
        spec_path.write_text(yaml.safe_dump(spec(args, config.sharding, root)))
        out = root / f"r{r}-n{config.nproc}-{config.sharding}"
        got = run(spec_path, out, config.nproc, cores, args.warmup, args.prompts * args.group)
        runs[(r, config)] = got
        print(f"  round {r + 1}, {config.label}: step {got.step:.3f} s, whole run {got.wall:.1f} s")
    for line in report(configs, runs, args.rounds):
        print(line)


if __name__ == "__main__":
    main()
