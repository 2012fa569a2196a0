"""Every path of the trainer that only a GPU runs, in one script and one table, for the rare
session that is lent a GPU (one NVIDIA H200 here, with minutes to spend): it must work the first
time and say at once what broke.

    python bench/gpu_check.py            # on CUDA: a ~0.8B Llama in bf16 (under 8 minutes)
    python bench/gpu_check.py --tiny     # on CPU: a 0.5M Llama in fp32 (a few minutes)
    python bench/gpu_check.py --estimate # anywhere: the train row's budget, no weights built

The model is a Llama built on this machine with random weights (no hub download): hidden
1536, 16 layers, 12 heads of 128 (4 for keys and values), MLP 4096, Llama 3's vocabulary of
128,256 (untied output layer), saved to a temporary folder and trained as `hf:<folder>`, with a
character tokenizer. Its prompts are 64 digits; the reward is 1 when a completion contains a
token whose id ends in 77, which a random policy draws in about 3 of 4 completions, so the
groups' advantages are not all zero. Each row runs the real trainer (`core.training.trainer.train`)
for `--steps` steps in a process of its own (`bench/gpu_check_rows.py`) and reports the last:

- `train`: RL steps with the predictive mask and the fused loss (`fused_pieces` counts the loss
  pieces that took the fused path), rollouts by the trainer's own engine. tokens/s is completion
  tokens per second of the step; `model_tflops` and `mfu` count 8N FLOPs per token (2N sampled,
  6N trained; N = parameters without the input embedding; each prompt once per group, as the
  trainer computes it; attention's own FLOPs not counted) over the step's wall time, against
  `--peak-tflops` (989 by default: the H200's bf16 dense peak on its data sheet; this
  workplace measured 790 for a plain 8192^3 bf16 matrix product); `update_mfu` is the update's
  6N share over its own time;
- `memory`: `torch.cuda.max_memory_allocated` of that run (on CPU: peak RSS above the
  imports) against `core.budget.estimate`, the worker's budget for the job, which must be an
  upper bound within 2x (bench/budget_calibration.py holds it to that on CPU). The estimate
  adds 1 GiB for the CUDA context, outside the allocator (`reserved_gib` is the allocator's
  own reserve); `estimate_fused` is the loss it counted;
- `mem-qwen2`, `mem-lora`, `mem-builtin`, `mem-unfused`: the same figures for one step of the
  other model kinds (`MEMORY` in gpu_check_rows.py: a Qwen2 of the Llama's shape, the Llama with
  LoRA, builtin:tiny of its dims, the unfused loss on a quarter of the prompts), each in a
  process of its own; a row fails where the loss that ran is not the one the estimate counted.
  The fsdp row reports the same for FSDP. `--only train,mem-qwen2,mem-lora,mem-builtin,
  mem-unfused,fsdp` runs the memory rows alone;
- `dp` and `fsdp`: the same run in a process group of one joined as `pdppo train --nproc N`
  joins it (nccl), taking every data-parallel branch (`GroupOfOne` in gpu_check_rows.py:
  `--nproc 1` itself starts no group), replicated, then sharded with FSDP2;
- `vllm`: rollouts by vLLM, or `skipped: vllm not installed`.

A row that raises is FAILED with its error and the rest still run; the exit status is 1 when
any row failed (a skip is not a failure), and the end of a failed row's stderr follows the
table. `--tiny` runs the same rows on CPU (gloo, fp32, hidden 128 x 2 layers, vocabulary of
640), so that CI keeps this script working (tests/deploy/test_gpu_check.py).

The trainer's config is pydantic, which the H200 image lacks (torch, transformers, peft,
pyyaml, safetensors, tokenizers and jinja2 are there; vLLM is not, and its wheel is far over
what a call may carry). Carry pydantic's wheels (3 MB), following the device README: in the
repo root, `echo /.whl/ >> .git/info/exclude`, then (pydantic 2.14 needs typing-extensions
4.16 or later, newer than the image may hold)

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \\
        typing-inspection==0.4.5 typing-extensions==4.16.0

and run with `carry: [".whl"]`:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; \\
        PYTHONUNBUFFERED=1 python3 bench/gpu_check.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_check_rows import GROUPS, Figure, Plan, Row, exit_code, train_spec  # noqa: E402
from core.models.local_hf import LlamaShape  # noqa: E402

ROWS_SCRIPT = REPO / "bench" / "gpu_check_rows.py"
H200_BF16_TFLOPS = 989.0


@dataclass(frozen=True)
class Setup:
    """The model and the work of one step, for a GPU or for `--tiny`."""

    shape: LlamaShape
    vocab: int
    dtype: str
    prompts: int
    group: int
    prompt_tokens: int
    new_tokens: int
    pattern: str  # a random policy's completion contains it about half the time or more


GPU = Setup(
    LlamaShape(hidden=1536, heads=12, kv_heads=4, layers=16, intermediate=4096, max_positions=512),
    vocab=128_256,
    dtype="bfloat16",
    prompts=16,
    group=8,
    prompt_tokens=64,
    new_tokens=128,
    pattern="77>",  # fillers <w...77>: 1% of the vocabulary, 72% of 128-token completions
)
TINY = Setup(
    LlamaShape(hidden=128, heads=2, kv_heads=2, layers=2, intermediate=256, max_positions=64),
    vocab=640,
    dtype="float32",
    prompts=4,
    group=4,
    prompt_tokens=8,
    new_tokens=8,
    pattern="7>",  # fillers <w...7>: 8% of this vocabulary, half of 8-token completions
)
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


def _tokenizer(setup: Setup) -> Any:
    """A character tokenizer of `setup.vocab` entries: filler tokens `<wN>` beyond the
    characters, which no prompt encodes to but the model samples."""
    from core.models.local_hf import PRINTABLE, char_tokenizer

    return char_tokenizer(SPECIALS, PRINTABLE, fillers=setup.vocab - len(SPECIALS) - len(PRINTABLE))


def build_model(folder: Path, setup: Setup, model_type: str = "llama") -> tuple[int, int]:
    """A random Llama (or another of `core.models.local_hf.MODEL_TYPES` of its shape) and its
    tokenizer, saved in the model's dtype; returns its parameters and those of its input
    embedding."""
    import torch
    from transformers.utils import logging

    from core.models.local_hf import save_model

    logging.disable_progress_bar()  # the table is the output

    model = save_model(
        folder,
        _tokenizer(setup),
        setup.shape,
        model_type=model_type,
        dtype=getattr(torch, setup.dtype),
    )
    params = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for p in model.get_input_embeddings().parameters())
    del model
    return params, embedding


def estimated_spec(work: Path, setup: Setup, cuda: bool) -> dict[str, Any]:
    """The `train` row's spec (its `train` section) with the model's config.json and tokenizer
    alone, no weights: all that `core.budget.estimate` reads, so that the budget of the GPU
    model is had in seconds on any machine (`--estimate`; tests/core/test_budget.py and the
    API's, tests/integration/test_budget_api.py)."""
    from core.models.local_hf import model_config

    model = work / "model"
    tok = _tokenizer(setup)
    model_config(tok, setup.shape).save_pretrained(str(model))
    tok.save_pretrained(str(model))
    write_prompts(work / "prompts.jsonl", model, setup)
    return train_spec(_plan(work, setup, cuda, steps=2, params=0, embedding=0, peak_tflops=0))


def write_prompts(path: Path, folder: Path, setup: Setup) -> None:
    """Digit strings of one length, so that every prompt has `setup.prompt_tokens` tokens
    (checked with the saved tokenizer, as the trainer encodes them)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    rng = random.Random(0)
    prompts = ["".join(rng.choices("0123456789", k=setup.prompt_tokens)) for _ in range(64)]
    for p in prompts:
        got = len(tok(p, add_special_tokens=True)["input_ids"])
        if got != setup.prompt_tokens:
            raise RuntimeError(f"a prompt of {setup.prompt_tokens} digits is {got} tokens")
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))


def run_group(group: str, plan_path: Path, timeout: float, env: dict[str, str]) -> list[Row]:
    """One child process's rows; all of them FAILED when it dies or hangs before reporting.
    It leads a process group of its own, killed whole at its timeout (or on our way out), so
    that nothing it started holds the device while the next row runs."""
    result = Path(plan_path).parent / f"{group}.result.json"
    log = Path(plan_path).parent / f"{group}.stderr"
    cmd = [sys.executable, str(ROWS_SCRIPT), group, str(plan_path), str(result)]
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, stdout=err, stderr=err, env=env, cwd=REPO, start_new_session=True
        )
        try:
            why = f"the process exited with {proc.wait(timeout=timeout)} before reporting"
        except subprocess.TimeoutExpired:
            why = f"timed out after {timeout:g} s"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if result.exists():  # reported, then hung or died on the way out: the rows stand
        return [Row(**r) for r in json.loads(result.read_text())]
    tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
    return [Row(n, "FAILED", detail=f"{why}: {tail[0]}") for n in GROUPS[group]]


def _format(value: Figure) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render(rows: list[Row]) -> list[str]:
    lines = [f"{'row':<11} {'status':<8} figures"]
    for r in rows:
        text = " ".join(f"{k}={_format(v)}" for k, v in r.figures.items()) or r.detail
        lines.append(f"{r.name:<11} {r.status:<8} {text}")
    return lines


def _failed_logs(rows: list[Row], work: Path) -> list[str]:
    out = []
    for group, names in GROUPS.items():
        log = work / f"{group}.stderr"
        if log.exists() and any(r.name in names and r.status == "FAILED" for r in rows):
            out += [f"--- end of {group}'s stderr", *log.read_text().splitlines()[-15:]]
    return out


def prepare(
    work: Path, setup: Setup, cuda: bool, steps: int, peak_tflops: float, groups: list[str]
) -> Path:
    """The model, its prompts and the plan every row reads (and the Qwen2 of the model's shape
    where the mem-qwen2 row runs); the plan's path."""
    model = work / "model"
    params, embedding = build_model(model, setup)
    write_prompts(work / "prompts.jsonl", model, setup)
    plan = _plan(
        work,
        setup,
        cuda=cuda,
        steps=steps,
        params=params,
        embedding=embedding,
        peak_tflops=peak_tflops,
    )
    if "mem-qwen2" in groups:
        build_model(work / "qwen2", setup, model_type="qwen2")
        plan = replace(plan, qwen_model=str(work / "qwen2"))
    path = work / "plan.json"
    path.write_text(json.dumps(asdict(plan)))
    return path


def _plan(
    work: Path,
    setup: Setup,
    cuda: bool,
    steps: int,
    params: int,
    embedding: int,
    peak_tflops: float,
) -> Plan:
    return Plan(
        device="cuda" if cuda else "cpu",
        dtype=setup.dtype,
        model=str(work / "model"),
        data=str(work / "prompts.jsonl"),
        work=str(work),
        prompts=setup.prompts,
        group=setup.group,
        new_tokens=setup.new_tokens,
        prompt_tokens=setup.prompt_tokens,
        steps=steps,
        pattern=setup.pattern,
        params=params,
        embedding_params=embedding,
        peak_flops=peak_tflops * 1e12 or None,
    )


def print_estimate(setup: Setup, cuda: bool) -> int:
    """The train row's budget, as `pdppo train --dry-run` prints it, and the default limit of
    its queue: the estimate is arithmetic on config.json, so any machine can show it."""
    from core.budget import check, describe, estimate, render_limits
    from core.config import TrainConfig
    from pdppo.settings import Settings

    queue: Literal["cpu", "gpu"] = "gpu" if cuda else "cpu"
    with tempfile.TemporaryDirectory(prefix="pdppo-gpu-check-") as work:
        spec = TrainConfig.model_validate(estimated_spec(Path(work), setup, cuda))
        budget = estimate(spec, queue=queue)
    limits = Settings(_env_file=None).budget_limits(queue)  # type: ignore[call-arg]
    for line in describe(budget):
        print(line)
    print(render_limits(asdict(limits)))
    problems = check(budget, limits)
    for problem in problems:
        print(f"over budget: {problem}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, a tiny Llama, fp32")
    parser.add_argument("--steps", type=int, default=2, help="steps per run; the last is shown")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help=f"the device's peak for MFU (default {H200_BF16_TFLOPS:g} on CUDA, none on CPU)",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per row process")
    parser.add_argument("--only", default=",".join(GROUPS), help="comma-separated row groups")
    parser.add_argument("--keep", action="store_true", help="keep the model and the runs")
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="print the budget of the train row's job (no weights built, no GPU needed)",
    )
    args = parser.parse_args()
    if args.estimate:
        return print_estimate(TINY if args.tiny else GPU, cuda=not args.tiny)
    started = time.perf_counter()
    import torch

    cuda = not args.tiny
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: run with --tiny for the CPU form", file=sys.stderr)
        return 2
    setup = TINY if args.tiny else GPU
    peak = args.peak_tflops if args.peak_tflops is not None else (H200_BF16_TFLOPS if cuda else 0)
    env = dict(os.environ)
    if args.tiny:
        env.setdefault("OMP_NUM_THREADS", "1")  # 2 shared cores; the children run one by one
    work = Path(tempfile.mkdtemp(prefix="pdppo-gpu-check-"))
    groups = [g for g in GROUPS if g in args.only.split(",")]
    try:
        s = setup.shape
        where = torch.cuda.get_device_name() if cuda else "cpu"
        print(
            f"pdppo GPU check on {where}, torch {torch.__version__}: a Llama (hidden {s.hidden}, "
            f"{s.layers} layers, vocabulary {setup.vocab:,}) in {setup.dtype}; {setup.prompts} "
            f"prompts x {setup.group}, prompts of {setup.prompt_tokens} tokens, "
            f"{setup.new_tokens} new tokens, {args.steps} steps"
            + (f"; MFU against {peak:g} TFLOP/s" if peak else ""),
            flush=True,
        )
        rows: list[Row] = []
        try:
            plan_path = prepare(
                work, setup, cuda=cuda, steps=args.steps, peak_tflops=peak, groups=groups
            )
        except Exception as exc:  # no model, no row: each says why
            why = f"building the model: {type(exc).__name__}: {exc}"
            rows = [Row(n, "FAILED", detail=why) for g in groups for n in GROUPS[g]]
        else:
            for group in groups:
                rows += run_group(group, plan_path, args.timeout, env)
                for name in () if args.keep else GROUPS[group]:  # a run's checkpoints: GBs
                    shutil.rmtree(work / name, ignore_errors=True)
        for line in render(rows):
            print(line)
        failed = sum(r.status == "FAILED" for r in rows)
        print(f"{time.perf_counter() - started:.1f} s, {failed} failed")
        for line in _failed_logs(rows, work):
            print(line)
        return exit_code(rows)
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
