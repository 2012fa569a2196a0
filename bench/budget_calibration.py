"""Calibrate `core.budget`'s memory estimate against the peak RSS of one real training step.

For each spec (built-in models of increasing size, then Hugging Face Llama and Qwen2 models
built here with random weights, LoRA, and FSDP over two gloo processes; fused loss and unfused
where both exist), each run starts fresh child processes (one per rank) that import the
trainer, record their RSS, run one training step (rollout, update, checkpoint, final model) and
report their peak RSS (VmHWM, `peak_rss_bytes`); a rank's measured memory is that peak minus
the RSS after the imports (the model's code among them), and a spec's is its largest rank's.
The estimate must be an upper bound, and not a wild one (within 2x):

    python bench/budget_calibration.py            # the table (about 10 minutes on 2 cores)
    python bench/budget_calibration.py --only 0,3  # some rows
    python bench/budget_calibration.py --list      # the rows' indices and labels

Prints one row per spec: parameters, tokens per step, whether the trainer's loss was fused
(`fused`: the estimate's flag, checked against the fused passes the child counted), estimate,
measured, estimate / measured. Exit status 1 when a row is under 1 or over 2, or when the
estimate's fused flag is not what the trainer did. The CUDA form of the same comparison
(`torch.cuda.max_memory_allocated`) is bench/gpu_check.py's `memory` rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RATIO_MAX = 2.0  # an estimate above twice the peak refuses jobs that fit


def _tiny(d: int, layers: int, heads: int, seq: int) -> dict[str, Any]:
    return {"name": "builtin:tiny", "tiny": {"d_model": d, "n_layers": layers, "n_heads": heads,
                                             "max_seq_len": seq}}  # fmt: skip


@dataclass(frozen=True)
class Spec:
    """One row: a train config's overrides, on `ranks` processes; `family` names a Hugging Face
    model built here (`HF_SHAPE`, `HF_VOCAB`) that `model.name` points at."""

    label: str
    overrides: dict[str, Any] = field(default_factory=dict)
    family: str | None = None  # "llama", "qwen2": a model of `core.models.local_hf.MODEL_TYPES`
    dtype: str = "float32"
    ranks: int = 1


# The Hugging Face rows' models: a vocabulary of 32K (a real model's order of magnitude, so that
# the [tokens, vocabulary] logits the fused loss avoids are a large part of an unfused step), and
# width and depth that keep a step to a minute on 2 cores; 128 sequences of a 17-character prompt
# and 16 new tokens.
HF_VOCAB = 32_000
HF_BATCH: dict[str, Any] = {
    "task": {"name": "reverse", "min_len": 8, "max_len": 8},
    "rollout": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 16},
}
UNFUSED = {"algorithm": {"fused_loss": False}}
FSDP = {"sharding": "fsdp"}
MB8 = {"algorithm": {"minibatches": 8}}  # a small update: the rollout is the largest phase
LORA = {"model": {"lora": {"r": 16, "alpha": 32}}}
LORA_HEAD = {"model": {"lora": {"r": 16, "alpha": 32, "target_modules": ["q_proj", "lm_head"]}}}
# builtin:tiny at the Hugging Face rows' vocabulary
WIDE_TINY = {"model": {"tiny": {"d_model": 128, "n_layers": 4, "n_heads": 4, "max_seq_len": 64,
                                "vocab_size": HF_VOCAB}}}  # fmt: skip


def _with(*parts: dict[str, Any]) -> dict[str, Any]:
    """The overrides merged section by section (the HF batch, then a row's own)."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


# (label, train config): increasing model size, batch and sequence; then the knobs that add
# memory of their own (exact estimator, bf16 rollout copy with stale snapshots, minibatches);
# then the Hugging Face models, fused and unfused, LoRA, and FSDP on two processes.
SPECS: list[Spec] = [
    Spec(
        "smoke d32 L1 16x17",
        {
            "model": _tiny(32, 1, 2, 32),
            "task": {"name": "reverse", "min_len": 2, "max_len": 3},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
            "algorithm": {"top_k": 8},
        },
    ),
    Spec("default d64 L2 128x21"),
    Spec(
        "d128 L4 256x42",
        {
            "model": _tiny(128, 4, 4, 128),
            "task": {"name": "reverse", "min_len": 8, "max_len": 8},
            "rollout": {"prompts_per_step": 32, "group_size": 8, "max_new_tokens": 24},
        },
    ),
    Spec(
        "d256 L4 512x50",
        {
            "model": _tiny(256, 4, 8, 128),
            "task": {"name": "reverse", "min_len": 8, "max_len": 8},
            "rollout": {"prompts_per_step": 64, "group_size": 8, "max_new_tokens": 32},
        },
    ),
    Spec(
        "d64 L2 1024x58",
        {
            "task": {"name": "reverse", "min_len": 16, "max_len": 16},
            "rollout": {"prompts_per_step": 64, "group_size": 16, "max_new_tokens": 32},
        },
    ),
    Spec(
        "d512 L8 32x21 (weights)",
        {
            "model": _tiny(512, 8, 8, 128),
            "rollout": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 8},
        },
    ),
    Spec(
        "d128 L2 512x40 exact",
        {
            "model": _tiny(128, 2, 4, 128),
            "task": {"name": "reverse", "min_len": 8, "max_len": 8},
            "rollout": {"prompts_per_step": 64, "group_size": 8, "max_new_tokens": 22},
            "algorithm": {"estimator": "exact"},
        },
    ),
    Spec(
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
    Spec("builtin V32K unfused", _with(HF_BATCH, WIDE_TINY, UNFUSED)),
    Spec("builtin V32K fused", _with(HF_BATCH, WIDE_TINY)),
    Spec("hf llama unfused", _with(HF_BATCH, UNFUSED), family="llama"),
    Spec("hf llama fused", HF_BATCH, family="llama"),
    Spec("hf llama fused mb=8 (rollout-bound)", _with(HF_BATCH, MB8), family="llama"),
    Spec("hf llama bf16 fused", HF_BATCH, family="llama", dtype="bfloat16"),
    Spec("hf qwen2 unfused", _with(HF_BATCH, UNFUSED), family="qwen2"),
    Spec("hf qwen2 fused", HF_BATCH, family="qwen2"),
    Spec("hf llama lora fused", _with(HF_BATCH, LORA), family="llama"),
    Spec("hf llama lora bf16 fused", _with(HF_BATCH, LORA), family="llama", dtype="bfloat16"),
    Spec("hf llama lora+head unfused", _with(HF_BATCH, LORA_HEAD), family="llama"),
    Spec("hf llama fsdp x2 unfused", _with(HF_BATCH, UNFUSED, FSDP), family="llama", ranks=2),
    Spec("hf llama fsdp x2 fused", _with(HF_BATCH, FSDP), family="llama", ranks=2),
    Spec("builtin V32K fsdp x2 fused", _with(HF_BATCH, WIDE_TINY, FSDP), ranks=2),
]


def hf_shape() -> Any:
    from core.models.local_hf import LlamaShape

    return LlamaShape(hidden=256, heads=4, kv_heads=2, layers=4, intermediate=704, max_positions=64)


def build_hf(folder: Path, family: str, dtype: str) -> Path:
    """A random `family` model with a character tokenizer of `HF_VOCAB` entries (fillers beyond
    the characters, as bench/gpu_check.py's), saved in `dtype` into `folder`."""
    import torch
    from transformers.utils import logging

    from core.models.local_hf import PRINTABLE, char_tokenizer, save_model

    logging.disable_progress_bar()
    specials = ("<pad>", "<s>", "</s>", "<unk>")
    tok = char_tokenizer(specials, PRINTABLE, fillers=HF_VOCAB - len(specials) - len(PRINTABLE))
    save_model(folder, tok, hf_shape(), model_type=family, dtype=getattr(torch, dtype))
    return folder


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM, of its memory since its exec). Not getrusage's
    ru_maxrss: Linux carries into it the peak of the memory that exec replaced, which for a
    child started with vfork (Python's subprocess) is its parent's: a child of a test worker
    that had grown to 700 MiB reported 480 MiB for a step that takes 120."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def import_model_code(cfg: Any) -> None:
    """What loading the spec's model imports (transformers' modeling code of its family, peft),
    imported before the RSS baseline: code, 100-200 MiB of it, not the job's memory."""
    if not cfg.model.name.startswith("hf:"):
        return
    import importlib

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    model_type = AutoConfig.from_pretrained(cfg.model.name.removeprefix("hf:")).model_type
    importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    if cfg.model.lora is not None:
        import peft
        import peft.tuners.lora  # noqa: F401


def child(config_json: str, rank: int = 0, ranks: int = 1, port: int = 0) -> None:
    """In a fresh process (rank `rank` of `ranks`, meeting at `port`): import, note the RSS,
    run one step, report the peak above it and how many fused statistics passes ran (the fused
    loss's, `core.objective.fused.projected_stats`: none on the unfused path)."""
    import torch

    import core.objective.fused as fused
    from core.config import TrainConfig
    from core.parallel.distributed import World, join_group, leave_group
    from core.training.trainer import train

    torch.set_num_threads(1)
    cfg = TrainConfig.model_validate(json.loads(config_json))
    import_model_code(cfg)
    passes = [0]
    real = fused.projected_stats

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes[0] += 1
        return real(*args, **kwargs)

    fused.projected_stats = counted  # the name its callers read
    world = World(rank, ranks) if ranks > 1 else None
    if world is not None:
        join_group(rank, ranks, port, cuda=False)
    base = rss_bytes()
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as out:
            train(cfg, Path(out), world=world)
            if world is not None:
                import torch.distributed as dist

                dist.barrier()  # no rank leaves (and removes its folder) under another
    finally:
        if world is not None:
            leave_group()
    peak = peak_rss_bytes()
    print(
        json.dumps(
            {
                "base": base,
                "peak": peak,
                "seconds": time.perf_counter() - t0,
                "fused_passes": passes[0],
            }
        )
    )


@dataclass(frozen=True)
class Measured:
    """A spec's step: its largest rank's peak above the imports, and each rank's fused passes."""

    bytes: int
    fused_passes: tuple[int, ...]
    seconds: float


def measure(config: dict[str, Any], ranks: int = 1, timeout: float = 900) -> Measured:
    """One step of `config` in `ranks` fresh processes (gloo, on this machine's CPU)."""
    from core.parallel.distributed import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    port = free_port() if ranks > 1 else 0
    cmd = [sys.executable, __file__, "--child", json.dumps(config)]
    procs = [
        subprocess.Popen(
            [*cmd, "--rank", str(r), "--ranks", str(ranks), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(ranks)
    ]
    outs = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        if proc.returncode != 0:
            for other in procs:
                other.kill()
            raise RuntimeError(f"a child failed ({proc.returncode}):\n{stderr[-3000:]}")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return Measured(
        bytes=max(o["peak"] - o["base"] for o in outs),
        fused_passes=tuple(o["fused_passes"] for o in outs),
        seconds=max(o["seconds"] for o in outs),
    )


def config_for(spec: Spec, models: Path | None = None) -> dict[str, Any]:
    """The spec's train config; its Hugging Face model, if any, built under `models` once."""
    base: dict[str, Any] = {"steps": 1, "checkpoint_every": 0, "device": "cpu", "seed": 0}
    config = {**base, **spec.overrides}
    if spec.family is not None:
        assert models is not None
        folder = models / f"{spec.family}-{spec.dtype}"
        if not folder.exists():
            build_hf(folder, spec.family, spec.dtype)
        model = {"name": f"hf:{folder}", "dtype": spec.dtype, **spec.overrides.get("model", {})}
        config["model"] = model
    return config


def main() -> int:
    from core.budget import estimate, format_bytes, format_count
    from core.config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated row indices")
    parser.add_argument("--list", action="store_true", help="the rows' indices and labels")
    args = parser.parse_args()
    if args.list:
        for i, spec in enumerate(SPECS):
            print(f"{i:>2} {spec.label}")
        return 0
    rows = range(len(SPECS))
    if args.only:
        rows = [int(i) for i in args.only.split(",")]  # type: ignore[assignment]
    header = (
        f"{'spec':<36} {'params':>7} {'tok/step':>8} {'fused':>5} {'estimate':>10} "
        f"{'measured':>10} {'ratio':>6}  largest items of the estimate"
    )
    print(header)
    print("-" * len(header))
    bad = 0
    with tempfile.TemporaryDirectory() as models:
        for i in rows:
            spec = SPECS[i]
            config = config_for(spec, Path(models))
            budget = estimate(TrainConfig.model_validate(config), queue="cpu", devices=spec.ranks)
            got = measure(config, spec.ranks)
            assert budget.peak_memory_bytes is not None and budget.params is not None
            ratio = budget.peak_memory_bytes / max(got.bytes, 1)
            ran_fused = all(n > 0 for n in got.fused_passes)
            fused = "yes" if budget.fused_loss else "no"
            if ran_fused != budget.fused_loss:
                fused += "!"  # the estimate's flag is not what the trainer did
            bad += not (1 <= ratio <= RATIO_MAX) or ran_fused != budget.fused_loss
            items = sorted(
                (m for m in budget.at_peak() if m.phase != "overhead"), key=lambda m: -m.bytes
            )
            print(
                f"{spec.label:<36} {format_count(budget.params):>7} "
                f"{format_count(budget.tokens_per_step):>8} {fused:>5} "
                f"{format_bytes(budget.peak_memory_bytes):>10} {format_bytes(got.bytes):>10} "
                f"{ratio:>6.2f}  "
                + ", ".join(f"{m.name} {format_bytes(m.bytes)}" for m in items[:2])
            )
            sys.stdout.flush()
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        extra = argparse.ArgumentParser()
        extra.add_argument("--rank", type=int, default=0)
        extra.add_argument("--ranks", type=int, default=1)
        extra.add_argument("--port", type=int, default=0)
        opts = extra.parse_args(sys.argv[3:])
        child(sys.argv[2], opts.rank, opts.ranks, opts.port)
    else:
        sys.exit(main())
