"""pdppo against TRL's GRPOTrainer on the same work: median seconds per step, and reward curves.

Both trainers train the same locally built Llama (`core.models.local_hf.make_chat_hf`: 0.5M
parameters, one token per character; saved to a temporary folder and loaded from it by each, no
hub download) on the same JSONL records, with the same work per step: 8 prompts x 8 completions
of at most 8 new tokens, sampled at temperature 1 without truncation (top-p 1, no top-k), one
optimizer update per step (one minibatch, one epoch, no KL term and so no reference model), fp32,
the same constant learning rate, gradients clipped at norm 1, advantages normalised by the
group's reward std (pdppo's `algorithm.normalize_std`, TRL's default `scale_rewards="group"`).
Both score a completion with the same check: pdppo's own grader (`core.graders.build_grader`),
which TRL's reward function calls. pdppo runs through its public entry,
`core.training.trainer.train`.

Tasks (`--task`), 110 single-digit sums and differences each, graded `string_check` `contains`
(the answer's digit anywhere in the completion): `short`, such as `3+4=` (5 prompt tokens with the
BOS); `long`, the same question behind an instruction (60 prompt tokens, 7.5x the completion:
the usual RL shape, a question and a short answer).

Rows: `pdppo`; `trl` with gradient checkpointing off (the like-for-like row); `trl-default` with
TRL's default gradient checkpointing on (what a TRL user gets: activations recomputed in the
backward). Everything else is the same in both TRL rows. TRL keeps its own default optimizer
(transformers' fused AdamW) and loss aggregation (`loss_type="dapo"`, a token mean over the
batch, which is what pdppo's loss is with one minibatch).

How it is timed: each row runs in its own spawned process (`torch.set_num_threads(1)`,
OMP_NUM_THREADS=1) and pauses in its trainer's step-end hook. The parent runs row after row for
`--steps` steps each, for `--repeats` rounds, rotating the order every round, so that a busy spell
on a shared machine hits every row alike; the first `--warmup` steps of each row are not timed
(first calls, allocator growth) but their rewards count in the curves. Per row: the median s/step,
the ratio pdppo/row of the medians, and the interquartile range of the per-round ratios (each
round's rows ran within seconds of each other: a wide range says the machine was busy). Numbers
from a machine others are using are noisy: compare ratios, not seconds. Rewards: the mean over
the first and the last few steps of each row, all of one seed (`--seed`; `--rows pdppo,trl`
and a few seeds to judge the curves: `trl-default` only recomputes, its rewards equal `trl`'s).

What one step's time counts (the `step` column):
- pdppo: its `step_time` metric, from the start of `run_step` (prompt sampling) to the end of the
  update: tokenizing, generation, grading, advantages, forward, backward, clipping, AdamW.
  Not counted: writing the metrics line, callbacks, checkpoints (one, after the last step).
- TRL: a `TrainerCallback`'s `on_step_begin` to its `on_step_end`: `_prepare_inputs` (tokenizing,
  `generate`, rewards, advantages), the loss's forward and backward, clipping, the optimizer and
  scheduler step, `zero_grad`. Not counted: fetching the prompt batch from the dataloader (before
  `on_step_begin`) and logging (after `on_step_end`; every step, as pdppo writes every step).
The `loop` column is the wall time from one step-end hook to the next, the pause excluded:
everything each trainer's loop does per step, its bookkeeping included.

    pip install -e '.[bench]'                         # TRL, for this benchmark only
    python bench/vs_trl.py                            # both tasks, 4 warm-up + 20 rounds of 2 steps
    python bench/vs_trl.py --task long --repeats 12   # longer, steadier
    python bench/vs_trl.py --quick                    # smoke run: 1 warm-up + 1 round of 2 steps
    PYTHONPATH=/tmp/old python bench/vs_trl.py        # time another pdppo, e.g. a `git archive`
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PROMPTS, GROUP, NEW_TOKENS = 8, 8, 8
"""The work per step: prompts, completions per prompt, new tokens per completion."""

ROWS = ("pdppo", "trl", "trl-default")
LONG_INSTRUCTION = "Reply with the one digit this equals, nothing else.\n"
GRADER: dict[str, Any] = {"type": "string_check", "operation": "contains"}
"""Both tasks: the answer's digit anywhere in the completion. A model trained from random weights
finds this reward within tens of steps (it first learns to emit digits), so the curves move."""
NO_TRL = (
    "bench/vs_trl.py needs TRL, which the project does not install by default: "
    "pip install -e '.[bench]' (see pyproject.toml's `bench` extra)"
)


def records(task: str) -> list[dict[str, str]]:
    """Every single-digit sum and difference (110 records), as `{"prompt", "answer"}`."""
    out = []
    for a in range(10):
        for b in range(10):
            for op, value in (("+", a + b), ("-", a - b)):
                if 0 <= value <= 9:
                    question = (
                        f"{a}{op}{b}=" if task == "short" else f"{LONG_INSTRUCTION}{a} {op} {b} ="
                    )
                    out.append({"prompt": question, "answer": str(value)})
    return out


@dataclass(frozen=True)
class Setup:
    """What every row of one task needs; picklable, sent to each spawned process."""

    row: str
    task: str
    model_dir: Path
    data_path: Path
    out_dir: Path
    total_steps: int
    lr: float
    seed: int
    device: str


@dataclass
class Step:
    step_time: float  # s, as each trainer delimits its step (see the module docstring)
    loop_time: float  # s, step-end hook to step-end hook, the pause excluded
    reward: float  # the step's mean reward over its PROMPTS * GROUP completions
    completion_len: float  # mean completion tokens


@dataclass
class Gate:
    """The pause in a row's step-end hook: reports the steps run since the last pause and
    waits for the parent's next order (`("run", n)` or `("finish",)`)."""

    conn: Connection
    left: int = 0
    finished: bool = False
    steps: list[Step] = field(default_factory=list)
    resumed: float = 0.0

    def start(self) -> None:
        """Before the first step: the row is built; wait for the first order."""
        self._wait()

    def step_done(self, step_time: float, reward: float, completion_len: float) -> None:
        now = time.perf_counter()
        self.steps.append(Step(step_time, now - self.resumed, reward, completion_len))
        self.left -= 1
        if self.left == 0 and not self.finished:
            self._wait()
        else:
            self.resumed = time.perf_counter()

    def _wait(self) -> None:
        self.conn.send(("steps", [vars(s) for s in self.steps]))
        self.steps = []
        order = self.conn.recv()
        self.finished = order[0] == "finish"
        self.left = 0 if self.finished else int(order[1])
        self.resumed = time.perf_counter()


# -- the rows, each in its own process ------------------------------------------------------


def pdppo_config(s: Setup) -> Any:
    """The `TrainConfig` of the pdppo row, validated as a job spec would be."""
    from core.config import TrainConfig

    return TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{s.model_dir}", "dtype": "float32"},
            "task": {"name": "jsonl", "path": str(s.data_path), "grader": GRADER},
            "rollout": {
                "prompts_per_step": PROMPTS,
                "group_size": GROUP,
                "max_new_tokens": NEW_TOKENS,
                "temperature": 1.0,
                "top_p": 1.0,
            },
            "algorithm": {"minibatches": 1, "epochs": 1, "kl_beta": 0.0, "normalize_std": True},
            "optim": {"lr": s.lr, "schedule": "constant", "max_grad_norm": 1.0},
            "steps": s.total_steps,
            "checkpoint_every": 0,
            "keep_checkpoints": 1,
            "silent_steps": 0,
            "seed": s.seed,
            "device": s.device,
        }
    )


def run_pdppo(s: Setup, gate: Gate) -> None:
    from core.training.callbacks import TrainerCallback
    from core.training.trainer import train

    class Hooks(TrainerCallback):
        started = False

        def should_stop(self) -> bool:
            if not self.started:  # first asked before step 1, after the run is built
                self.started = True
                gate.start()
            return False

        def on_step(self, step: int, metrics: dict[str, float]) -> None:
            gate.step_done(metrics["step_time"], metrics["reward_mean"], metrics["response_len"])

    train(pdppo_config(s), s.out_dir, callback=Hooks())


def run_trl(s: Setup, gate: Gate) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from core.graders import build_grader

    grader = build_grader(pdppo_config(s).task.grader)
    rewards: list[tuple[float, float]] = []  # per generation batch: (mean reward, mean length)

    def reward(
        prompts: list[str], completions: list[str], completion_ids: list[list[int]], **kw: Any
    ) -> list[float | None]:  # TRL's type: None would mean "no score from this function"
        if len(completions) != PROMPTS * GROUP or len(set(prompts)) > PROMPTS:
            raise RuntimeError(
                f"TRL graded {len(completions)} completions of {len(set(prompts))} "
                f"prompts in one step, not {PROMPTS * GROUP} of {PROMPTS}"
            )
        scores = [
            grader.score(c, {"prompt": p, "answer": a})
            for p, c, a in zip(prompts, completions, kw["answer"], strict=True)
        ]
        rewards.append((sum(scores) / len(scores), sum(map(len, completion_ids)) / len(scores)))
        return [*scores]

    def sync() -> None:  # as pdppo's step_time does: the GPU's queued work belongs to the step
        if s.device == "cuda":
            torch.cuda.synchronize()

    class Hooks(TrainerCallback):
        t0 = 0.0

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            gate.start()

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            sync()
            dt = time.perf_counter() - self.t0
            gate.step_done(dt, *rewards[-1])

    args = GRPOConfig(
        output_dir=str(s.out_dir),
        # one generation batch of PROMPTS * GROUP completions per optimizer step: with
        # gradient_accumulation_steps=1, steps_per_generation defaults to 1 and
        # generation_batch_size to per_device_train_batch_size (completions, not prompts)
        per_device_train_batch_size=PROMPTS * GROUP,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        num_iterations=1,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        use_vllm=False,
        gradient_checkpointing=s.row == "trl-default",
        bf16=False,
        fp16=False,
        model_init_kwargs={"dtype": torch.float32},
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        max_steps=s.total_steps,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=s.seed,
        use_cpu=s.device == "cpu",
    )
    data = Dataset.from_list(records(s.task))
    trainer = GRPOTrainer(
        model=str(s.model_dir),
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        callbacks=[Hooks()],
    )
    trainer.train()


def row_main(s: Setup, conn: Connection, quiet: bool) -> None:
    """A spawned row: one torch thread, the trainer's chatter silenced, errors sent home."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if quiet:  # TRL prints its logs each step; stderr (warnings, tracebacks) stays
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
    try:
        import torch

        torch.set_num_threads(1)
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        if quiet:  # transformers 5's renaming notices, once per row
            warnings.simplefilter("ignore", FutureWarning)
        gate = Gate(conn)
        (run_pdppo if s.row == "pdppo" else run_trl)(s, gate)
        conn.send(("exit", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise


# -- the parent: interleaving and the table --------------------------------------------------


@dataclass
class Row:
    name: str
    proc: Any  # multiprocessing.Process (spawn context)
    conn: Connection
    steps: list[list[Step]] = field(default_factory=list)  # per chunk, warm-up first

    def receive(self, timeout: float = 1800.0) -> tuple[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.conn.poll(1.0):
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"row {self.name} died or hung (exit code {self.proc.exitcode})")
        kind, payload = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"row {self.name} failed:\n{payload}")
        return kind, payload

    def run(self, n: int) -> None:
        self.conn.send(("run", n))
        _, payload = self.receive()
        self.steps.append([Step(**p) for p in payload])


def run_task(task: str, root: Path, model_dir: Path, a: argparse.Namespace) -> dict[str, Any]:
    """All rows of one task, interleaved; returns the summary the table is printed from."""
    data_path = root / f"{task}.jsonl"
    data_path.write_text("".join(json.dumps(r) + "\n" for r in records(task)))
    total = a.warmup + a.steps * a.repeats
    ctx = mp.get_context("spawn")
    rows: list[Row] = []
    try:
        base = Setup(
            row="",
            task=task,
            model_dir=model_dir,
            data_path=data_path,
            out_dir=root,
            total_steps=total,
            lr=a.lr,
            seed=a.seed,
            device=a.device,
        )
        for name in a.rows:
            setup = replace(base, row=name, out_dir=root / f"{task}-{name}")
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=row_main, args=(setup, child, not a.verbose), daemon=True)
            proc.start()
            rows.append(Row(name, proc, parent))
        for row in rows:
            row.receive()  # built and paused before its first step
        chunks = ([a.warmup] if a.warmup else []) + [a.steps] * a.repeats
        for i, n in enumerate(chunks):
            for row in rows[i % len(rows) :] + rows[: i % len(rows)]:
                row.run(n)
        for row in rows:
            row.conn.send(("finish",))
            row.receive()
            row.proc.join(60)
    finally:
        for row in rows:
            if row.proc.is_alive():
                row.proc.terminate()
    return summarize(task, rows, a)


def summarize(task: str, rows: list[Row], a: argparse.Namespace) -> dict[str, Any]:
    timed = 1 if a.warmup else 0  # the first chunk is the warm-up
    window = max(1, min(10, (a.warmup + a.steps * a.repeats) // 3))
    out: dict[str, Any] = {"task": task, "rows": {}}
    for row in rows:
        chunks = row.steps[timed:]
        flat = [s for c in chunks for s in c]
        every = [s for c in row.steps for s in c]
        out["rows"][row.name] = {
            "step_s": statistics.median(s.step_time for s in flat),
            "loop_s": statistics.median(s.loop_time for s in flat),
            "per_round": [statistics.median(s.step_time for s in c) for c in chunks],
            "reward_first": statistics.fmean(s.reward for s in every[:window]),
            "reward_last": statistics.fmean(s.reward for s in every[-window:]),
            "completion_len": statistics.fmean(s.completion_len for s in every),
            "steps": len(every),
        }
    ours = out["rows"]["pdppo"]
    for r in out["rows"].values():
        r["ratio"] = ours["step_s"] / r["step_s"]
        paired = [p / q for p, q in zip(ours["per_round"], r["per_round"], strict=True)]
        quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        r["round_iqr"] = (quartiles[0], quartiles[2])
    out["window"] = window
    return out


def print_table(summary: dict[str, Any], prompt_tokens: float) -> None:
    rows = summary["rows"]
    w = summary["window"]
    print(
        f"\ntask {summary['task']}: prompt {prompt_tokens:.0f} tokens, "
        f"{PROMPTS} prompts x {GROUP} completions x {NEW_TOKENS} new tokens per step"
    )
    print(
        f"{'row':12} {'step s':>8} {'loop s':>8} {'pdppo/row':>10} {'round IQR':>16} "
        f"{'tokens':>7} {f'reward first {w} -> last {w}':>28}"
    )
    for name, r in rows.items():
        spread = "{:.2f}-{:.2f}".format(*r["round_iqr"])
        curve = f"{r['reward_first']:.3f} -> {r['reward_last']:.3f}"
        print(
            f"{name:12} {r['step_s']:8.3f} {r['loop_s']:8.3f} {r['ratio']:10.2f} {spread:>16} "
            f"{r['completion_len']:7.1f} {curve:>28}"
        )


def prompt_length(model_dir: Path, task: str) -> float:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    lengths = [len(tok(r["prompt"])["input_ids"]) for r in records(task)]
    return statistics.fmean(lengths)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0],
        epilog="See the module docstring for what is and is not counted in a step.",
    )
    p.add_argument("--task", choices=("short", "long", "both"), default="both")
    p.add_argument("--steps", type=int, default=2, help="steps per row per round (default 2)")
    p.add_argument("--repeats", type=int, default=20, help="timed rounds (default 20)")
    p.add_argument("--warmup", type=int, default=4, help="untimed first steps (default 4)")
    p.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"comma-separated rows to run, pdppo among them (default {','.join(ROWS)})",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=1e-3,
        help="both trainers (default 1e-3: the model is trained from random weights)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up, 1 round of 2")
    p.add_argument("--json", type=Path, help="also write the summaries to this file")
    p.add_argument("--verbose", action="store_true", help="keep the trainers' own output")
    a = p.parse_args(argv)
    if a.quick:
        a.warmup, a.steps, a.repeats = 1, 2, 1
    for name in ("steps", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.warmup < 0:
        p.error("--warmup must be at least 0")
    a.rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = sorted(set(a.rows) - set(ROWS))
    if unknown or "pdppo" not in a.rows or len(set(a.rows)) != len(a.rows):
        p.error(f"--rows must name pdppo and distinct rows among {', '.join(ROWS)}, not {a.rows}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        import trl
    except ImportError:
        print(NO_TRL, file=sys.stderr)
        return 2
    import transformers

    import core
    from core.models.local_hf import make_chat_hf

    transformers.logging.disable_progress_bar()

    tasks = ("short", "long") if a.task == "both" else (a.task,)
    print(f"pdppo from {Path(core.__file__).parent}, trl {trl.__version__}")
    print(
        f"{a.warmup} warm-up + {a.repeats} rounds x {a.steps} steps per "
        f"row; lr {a.lr}; device {a.device}; one torch thread per row"
    )
    summaries = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        root = Path(tmp)
        model_dir = make_chat_hf(root / "model", seed=a.seed)
        for task in tasks:
            started = time.perf_counter()
            summary = run_task(task, root, model_dir, a)
            summary["wall_s"] = time.perf_counter() - started
            summary["prompt_tokens"] = prompt_length(model_dir, task)
            print_table(summary, summary["prompt_tokens"])
            summaries.append(summary)
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "trl": trl.__version__,
                    "args": vars(a) | {"json": str(a.json)},
                    "tasks": summaries,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
