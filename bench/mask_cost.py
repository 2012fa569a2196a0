"""Cost of each trust-region mask and estimator against the floor of one pass over the logits.

For N tokens x V vocabulary logits on CPU, every configuration is timed next to
`torch.log_softmax` over the same logits in the same process, call after call: each round times
one floor and one mask call per configuration (and per revision), the configurations alternate
within the round, and the printed ratio is the median over rounds of the per-round ratios, so
load that comes and goes on a shared machine touches both sides of a ratio alike. Torch runs
`--threads` intra-op threads (1 by default: a figure that does not depend on the machine's
cores or on its other work).

`--rev REV...` (and `--before`, the revision before the fidelity changes of 17b5415, whose rest
and tail sums made the default path cost more than a log_softmax) times those revisions' `core/`
side by side: each is extracted with `git archive` into a temporary directory and runs in a
worker process of its own, and the workers take turns within every round, so one run gives the
before/after table.

Extra peak memory is the rise of the process's resident set during one call, sampled every
0.5 ms in a fresh process per configuration (so it inherits no other configuration's heap),
with every allocation over 64 KiB on its own mapping (freed scratch leaves the resident set);
in MiB and in units of one (N, V) fp32 buffer.

    python bench/mask_cost.py                                      # 8192 x 32000, every config
    python bench/mask_cost.py --tokens 1024 --config predictive/tv/topk --vocab 32000 152064
    python bench/mask_cost.py --tokens 1024 --before --rev 1e521c6 # before/after, one run
    python bench/mask_cost.py --corrections --tokens 2048           # each off-policy correction

`--corrections` times the mask with each off-policy correction (`core.objective.corrections`)
after it, `MASK+CORRECTION` (the mask's decision, then the correction's weights from its ratio;
sequences of 64 tokens for the sequence-level ones), next to the mask alone: what each option
adds to the trust region's pass, against the same log_softmax floor. Revisions before the
corrections cannot time these configurations.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
BEFORE_FIDELITY = "17b5415^"

CONFIGS: list[str] = [
    # mask/kind/estimator
    "ppo_clip/tv/binary",
    "dppo/tv/binary",
    "dppo/tv/topk",
    "predictive/tv/binary",
    "predictive/tv/topk",
    "predictive/kl/topk",
    "predictive/kl_reverse/topk",
    "predictive/tv/topk_tail",
    "predictive/tv/exact",
]

CORRECTION_BASES = ["ppo_clip/tv/binary", "predictive/tv/topk"]
"""The cheapest mask (the ratio alone) and the default one, under which each correction is
timed: the first shows the correction's own cost, the second what a default run pays."""

CORRECTIONS: dict[str, dict[str, object]] = {
    "tis": {"type": "tis", "cap": 2.0},
    "tis_seq": {"type": "tis", "level": "sequence", "cap": 2.0},
    "mis": {"type": "mis", "cap": 2.0},
    "mis_seq": {"type": "mis", "level": "sequence", "cap": 2.0},
    "icepop": {"type": "icepop", "low": 0.5, "high": 5.0},
    "geo_rs": {"type": "geo_rs", "level": "sequence", "low": 0.999, "high": 1.001},
    "cispo": {"type": "cispo", "low": 0.0, "high": 1.28},
}
"""The `core.objective.corrections.Correction` of each timed option (its own field names)."""

CORRECTION_CONFIGS: list[str] = [
    *CORRECTION_BASES,
    *(f"{base}+{name}" for base in CORRECTION_BASES for name in CORRECTIONS),
]

SEQUENCE_TOKENS = 64
"""Tokens per sequence in the timed batch (the sequence-level corrections sum over these)."""


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


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class _Inputs:
    """The logits, behavior view, tokens and advantages of one vocabulary, built alike by every
    revision (the same seeds, torch's generator) with that revision's own `topk_view`."""

    def __init__(self, tokens: int, vocab: int, k: int, full: bool) -> None:
        import torch

        try:
            synthetic = importlib.import_module("core.objective.synthetic")
        except ImportError:  # revisions before the core/objective/ layout
            synthetic = importlib.import_module("core.synthetic")
        topk_view = synthetic.topk_view

        gen = torch.Generator().manual_seed(0)
        self.logits = torch.randn(tokens, vocab, generator=gen).mul_(3.0)
        # mu: a perturbed copy, kept as full log-probs only when `exact` is asked for
        logmu = self.logits + torch.randn(tokens, vocab, generator=gen)
        torch.log_softmax(logmu, dim=-1, out=logmu)
        self.tokens = torch.multinomial(logmu[:, :512].exp(), 1, generator=gen).squeeze(-1)
        self.view = topk_view(logmu, self.tokens, k, keep_full=False)
        self.full_view = topk_view(logmu, self.tokens, k, keep_full=True) if full else None
        del logmu
        self.advantages = torch.randn(tokens, generator=gen)
        self.vocab = vocab

    def calls(self, config: str) -> tuple[Callable[[], object], Callable[[], object]]:
        """(the floor, the mask) for `config`."""
        import torch

        from core import TrustRegion, trust_region_mask

        base, _, corrected = config.partition("+")
        mask, kind, estimator = base.split("/")
        view = self.full_view if estimator == "exact" else self.view
        assert view is not None
        region = TrustRegion(mask=mask, kind=kind, estimator=estimator)  # type: ignore[arg-type]

        def floor() -> object:
            return torch.log_softmax(self.logits, dim=-1)

        def run() -> object:
            return trust_region_mask(
                logits=self.logits,
                behavior=view,
                tokens=self.tokens,
                advantages=self.advantages,
                region=region,
            )

        if not corrected:
            return floor, run
        corrections = importlib.import_module("core.objective.corrections")
        masks = importlib.import_module("core.objective.masks")
        correction = corrections.Correction(**CORRECTIONS[corrected])
        n = len(self.tokens)
        sequences = torch.arange(n) // SEQUENCE_TOKENS
        everywhere = torch.ones(n, dtype=torch.bool)

        def run_corrected() -> object:
            decision = masks.trust_region(self.logits, view, self.tokens, self.advantages, region)
            weights = corrections.correction_weights(
                decision.log_ratio,
                correction,
                is_cap=region.is_cap,
                response_mask=everywhere,
                sequence_ids=sequences,
            )
            return decision.keep, weights

        return floor, run_corrected


def _worker(args: argparse.Namespace) -> None:
    """Answers one JSON line per request line: {"config", "vocab"} -> the floor's and the mask's
    seconds for one call each (a warm-up call of both first, the first time a config is seen)."""
    import torch

    torch.set_num_threads(args.threads)
    inputs: _Inputs | None = None
    seen: set[tuple[str, int]] = set()
    for line in sys.stdin:
        req = json.loads(line)
        config, vocab = req["config"], int(req["vocab"])
        if inputs is None or inputs.vocab != vocab:
            inputs = None  # free the last vocabulary's tensors before building the next
            inputs = _Inputs(args.tokens, vocab, args.k, req["full"])
        floor, run = inputs.calls(config)
        if (config, vocab) not in seen:
            seen.add((config, vocab))
            run(), floor()  # lazy initialisations are not the op's time
        t_floor, t_run = _timed(floor), _timed(run)
        print(json.dumps({"floor": t_floor, "run": t_run}), flush=True)


def _memory_child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    inputs = _Inputs(args.tokens, args.vocab[0], args.k, args.child.endswith("/exact"))
    floor, run = inputs.calls(args.child)
    run(), floor()  # warm-up: lazy initialisations are not the op's memory
    print(json.dumps({"floor": _peak_extra(floor), "run": _peak_extra(run)}))


def _tree(rev: str | None, tmp: Path) -> Path:
    """The directory whose `core/` is revision `rev`'s (the working tree's for None)."""
    if rev is None:
        return ROOT
    out = tmp / rev.replace("/", "_").replace("^", "_parent")
    out.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "core"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def _common(args: argparse.Namespace) -> list[str]:
    return [
        *("--tokens", str(args.tokens), "--k", str(args.k), "--threads", str(args.threads)),
    ]


class _Worker:
    def __init__(self, tree: Path, args: argparse.Namespace) -> None:
        cmd = [sys.executable, __file__, "--worker", *_common(args)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree
        )

    def time(self, config: str, vocab: int, full: bool) -> dict[str, float]:
        stdin: IO[str] | None = self.proc.stdin
        stdout: IO[str] | None = self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps({"config": config, "vocab": vocab, "full": full}) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the timing worker for {config} at V={vocab} died")
        row: dict[str, float] = json.loads(line)
        return row

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def _memory(tree: Path, config: str, vocab: int, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", config, "--vocab", str(vocab), *_common(args)]
    env = {**os.environ, "PYTHONPATH": str(tree), "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree)
    row: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000])
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7, help="timed calls per configuration")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--config",
        nargs="+",
        choices=CONFIGS + CORRECTION_CONFIGS,
        default=None,
        metavar="M/K/E[+CORRECTION]",
    )
    parser.add_argument(
        "--corrections",
        action="store_true",
        help="time each off-policy correction after two masks (the configs "
        + ", ".join(CORRECTION_CONFIGS)
        + ")",
    )
    parser.add_argument(
        "--rev", nargs="+", default=[], help="also time these git revisions' core/, side by side"
    )
    parser.add_argument(
        "--before",
        action="store_true",
        help=f"--rev {BEFORE_FIDELITY}, before the fidelity changes",
    )
    parser.add_argument("--no-memory", action="store_true", help="time only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    if args.child:
        _memory_child(args)
        return
    if args.config is None:
        args.config = CORRECTION_CONFIGS if args.corrections else CONFIGS
    run(args, [BEFORE_FIDELITY] * args.before + args.rev)


def run(args: argparse.Namespace, rev: list[str]) -> None:
    import torch

    revs: list[str | None] = [*rev, None]
    label: dict[str | None, str] = {r: r or "now" for r in revs}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {r: _tree(r, Path(tmp)) for r in revs}
        for vocab in args.vocab:
            buffer = args.tokens * vocab * 4
            print(
                f"\n{args.tokens} tokens x {vocab} vocab, K={args.k}, fp32 CPU, {args.threads} "
                f"thread(s), {args.rounds} interleaved rounds; one (N, V) fp32 buffer = "
                f"{buffer / 2**20:.0f} MiB; torch {torch.__version__}"
            )
            full = any(c.endswith("/exact") for c in args.config)
            workers = {r: _Worker(trees[r], args) for r in revs}
            ratios: dict[tuple[str, str | None], list[float]] = {}
            times: dict[tuple[str, str | None], list[float]] = {}
            floors: list[float] = []
            try:
                for _ in range(args.rounds):
                    for config in args.config:
                        for r in revs:
                            t = workers[r].time(config, vocab, full)
                            ratios.setdefault((config, r), []).append(t["run"] / t["floor"])
                            times.setdefault((config, r), []).append(t["run"])
                            floors.append(t["floor"])
            finally:
                for w in workers.values():
                    w.close()
            _table(
                args,
                vocab,
                revs,
                label=label,
                trees=trees,
                ratios=ratios,
                times=times,
                floors=floors,
                buffer=buffer,
            )


def _table(
    args: argparse.Namespace,
    vocab: int,
    revs: list[str | None],
    label: dict[str | None, str],
    trees: dict[str | None, Path],
    ratios: dict[tuple[str, str | None], list[float]],
    times: dict[tuple[str, str | None], list[float]],
    floors: list[float],
    buffer: int,
) -> None:
    head = f"{'mask/kind/estimator':<27} {'rev':<9} {'time':>8} {'x floor':>8} {'[min, max]':>13}"
    print(head + ("" if args.no_memory else f" {'extra MiB':>10} {'buffers':>8}"))
    for config in args.config:
        for r in revs:
            rs = ratios[(config, r)]
            line = (
                f"{config:<27} {label[r]:<9} {statistics.median(times[(config, r)]) * 1e3:7.1f}ms "
                f"{statistics.median(rs):7.2f}x [{min(rs):5.2f}, {max(rs):5.2f}]"
            )
            if not args.no_memory:
                m = _memory(trees[r], config, vocab, args)
                line += f" {m['run'] / 2**20:10.0f} {m['run'] / buffer:8.2f}"
            print(line)
    print(f"{'floor: torch.log_softmax':<37} {statistics.median(floors) * 1e3:7.1f}ms {1:7.2f}x")


if __name__ == "__main__":
    main()
