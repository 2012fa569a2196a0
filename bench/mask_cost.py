"""Cost of each trust-region mask and estimator against the floor of one pass over the logits.

For N tokens x V vocabulary logits on CPU, each configuration runs in a fresh subprocess (so
peak-memory readings do not inherit another configuration's heap) and is timed next to
`torch.log_softmax` over the same logits in the same process, so the printed ratio is measured
side by side. Extra peak memory is the rise of the process's resident set during one call,
sampled every 0.5 ms, in MiB and in units of one (N, V) fp32 buffer.

    python bench/mask_cost.py                 # 8192 x 32000, the issue's setting
    python bench/mask_cost.py --tokens 1024   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

CONFIGS: list[tuple[str, str, str]] = [
    # (mask, kind, estimator)
    ("ppo_clip", "tv", "binary"),
    ("dppo", "tv", "binary"),
    ("dppo", "tv", "topk"),
    ("predictive", "tv", "binary"),
    ("predictive", "tv", "topk"),
    ("predictive", "kl", "topk"),
    ("predictive", "kl_reverse", "topk"),
    ("predictive", "tv", "topk_tail"),
    ("predictive", "tv", "exact"),
]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_extra(fn: Callable[[], object]) -> int:
    """Largest resident-set rise while `fn` runs, sampled from a thread (torch drops the GIL)."""
    base, peak, done = _rss_bytes(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes() - base)
            time.sleep(0.0005)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        result = fn()
        peak[0] = max(peak[0], _rss_bytes() - base)
    finally:
        done.set()
        thread.join()
    del result
    return peak[0]


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _child(
    config: str, measure: str, tokens: int, vocab: int, k: int, repeats: int, threads: int | None
) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)
    from core import trust_region_mask
    from core.objective.synthetic import topk_view

    mask, kind, estimator = config.split(":")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=gen).mul_(3.0)
    # mu: a perturbed copy, kept as full log-probs only when the estimator reads them
    logmu = logits + torch.randn(tokens, vocab, generator=gen)
    torch.log_softmax(logmu, dim=-1, out=logmu)
    sampled = torch.multinomial(logmu[:, :512].exp(), 1, generator=gen).squeeze(-1)
    view = topk_view(logmu, sampled, k, keep_full=estimator == "exact")
    if estimator != "exact":
        del logmu
    advantages = torch.randn(tokens, generator=gen)

    def floor() -> object:
        return torch.log_softmax(logits, dim=-1)

    def run() -> object:
        return trust_region_mask(
            logits=logits,
            behavior=view,
            tokens=sampled,
            advantages=advantages,
            mask=mask,  # type: ignore[arg-type]
            kind=kind,  # type: ignore[arg-type]
            estimator=estimator,  # type: ignore[arg-type]
        )

    if measure == "memory":
        run(), floor()  # warm-up: lazy initialisations are not the op's memory
        print(json.dumps({"floor": _peak_extra(floor), "run": _peak_extra(run)}))
        return
    run(), floor()
    t_floor, t_run = [], []
    for _ in range(repeats):  # interleaved so both see the same machine load
        t_floor.append(_median_time(floor, 1))
        t_run.append(_median_time(run, 1))
    print(json.dumps({"floor": statistics.median(t_floor), "run": statistics.median(t_run)}))


def _measure(config: str, measure: str, args: argparse.Namespace) -> dict[str, float]:
    """One configuration in a fresh process. Memory runs force every allocation over 64 KiB
    onto its own mapping, so freed scratch leaves the resident set and the next peak is seen;
    timing runs keep the allocator's defaults, as in training."""
    cmd = [sys.executable, __file__, "--child", config, "--measure", measure]
    cmd += ["--tokens", str(args.tokens), "--vocab", str(args.vocab), "--k", str(args.k)]
    cmd += ["--repeats", str(args.repeats)]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    if measure == "memory":
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    row: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--measure", choices=["time", "memory"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(
            args.child, args.measure, args.tokens, args.vocab, args.k, args.repeats, args.threads
        )
        return

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    buffer = args.tokens * args.vocab * 4
    print(
        f"{args.tokens} tokens x {args.vocab} vocab, K={args.k}, fp32 CPU, "
        f"{torch.get_num_threads()} threads; one (N, V) fp32 buffer = {buffer / 2**20:.0f} MiB"
    )
    print(
        f"{'mask':<11} {'kind':<11} {'estimator':<10} {'time':>8} {'x floor':>8} "
        f"{'extra MiB':>10} {'buffers':>8}"
    )
    floors_t, floors_m = [], []
    for mask, kind, estimator in CONFIGS:
        config = f"{mask}:{kind}:{estimator}"
        t, m = _measure(config, "time", args), _measure(config, "memory", args)
        floors_t.append(t["floor"])
        floors_m.append(m["floor"])
        print(
            f"{mask:<11} {kind:<11} {estimator:<10} {t['run'] * 1e3:7.0f}ms "
            f"{t['run'] / t['floor']:7.2f}x {m['run'] / 2**20:10.0f} {m['run'] / buffer:8.2f}"
        )
    t, m = statistics.median(floors_t), statistics.median(floors_m)
    print(
        f"{'floor: torch.log_softmax':<33} {t * 1e3:7.0f}ms {1:7.2f}x {m / 2**20:10.0f} "
        f"{m / buffer:8.2f}"
    )


if __name__ == "__main__":
    main()
