"""Step time and throughput of one job on 1 and N data-parallel processes (`pdppo train --nproc`),
replicated and sharded (`train.sharding: fsdp`).

The same spec runs with --nproc 1, --nproc N, and --nproc N sharded, one after the other on this
machine; printed
per run: median step time, median rollout and update time, and tokens/s (response tokens of the
whole batch over the step's wall time), over the steps after a warm-up, and the speedup of N
processes against one. On CPU each process gets cores / N threads, so the comparison is one
process with all cores against N processes with a share each (torch's intra-op threads against
data parallelism), not free extra hardware.

`--engine vllm` (in a virtualenv with the `vllm` extra) samples with vLLM instead, an engine per
process: the chat example's Llama shape (built locally, heads of 64 for vLLM's CPU kernels) on
its arithmetic records, 1 and N processes, replicated.

    python bench/scaling.py [--nproc 2] [--steps 12] [--warmup 2] [--prompts 16] [--group 8]
    python bench/scaling.py --engine vllm
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


def run(spec_path: Path, out: Path, nproc: int, threads: int) -> tuple[float, list[dict]]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "from pdppo.cli import main; main()", "train", str(spec_path),
         "--out", str(out), "--nproc", str(nproc), "--quiet"],
        env=env, cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"pdppo train --nproc {nproc} failed:\n{done.stderr[-3000:]}")
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return wall, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pdppo-scaling-"))
    model = "builtin:tiny d_model 256 x 4 layers,"
    if args.engine == "vllm":
        model = "hf chat Llama (hidden 128, 2 layers), vLLM rollouts,"
    print(
        f"{model} {args.prompts} prompts x {args.group} per step, "
        f"up to 16 new tokens, {args.steps} steps ({args.warmup} warm-up), {args.cores} cores"
    )
    runs = [(1, "replicate"), (args.nproc, "replicate"), (args.nproc, "fsdp")]
    base = None
    for nproc, sharding in runs[:2] if args.engine == "vllm" else runs:
        spec_path = root / f"{sharding}.yaml"
        spec_path.write_text(yaml.safe_dump(spec(args, sharding, root)))
        out = root / f"n{nproc}-{sharding}"
        wall, rows = run(spec_path, out, nproc, max(args.cores // nproc, 1))
        timed = rows[args.warmup :]
        step = statistics.median(r["step_time"] for r in timed)
        rollout = statistics.median(r["rollout_time"] for r in timed)
        update = statistics.median(r["update_time"] for r in timed)
        tokens = statistics.median(r["response_len"] * args.prompts * args.group for r in timed)
        speed = tokens / step
        base = base or speed
        label = f"--nproc {nproc}" + (" fsdp" if sharding == "fsdp" and nproc > 1 else "")
        print(
            f"{label}: step {step:.3f} s (rollout {rollout:.3f}, update {update:.3f}), "
            f"{speed:.0f} tokens/s, x{speed / base:.2f} of one process; whole run {wall:.1f} s"
        )


if __name__ == "__main__":
    main()
