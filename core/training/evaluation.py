"""Held-out evaluation and rollout samples: what a run reports besides its training metrics.

Rewards on the training prompts say how well the policy does on what it is being pushed on;
they cannot tell learning from memorising. So every `train.eval_every` steps (and after the
last one) the current policy answers a fixed held-out set (`Task.held_out()`, first
`eval_max_prompts` prompts): `eval_samples` sampled completions per prompt at the rollout's
temperature and top-p, plus one greedy completion when `eval_greedy`. And every
`train.log_samples_every` steps a few prompt/completion/reward triples of that step's rollout
are kept, so a person sees what the model writes while it learns.

Evaluation must not change training: a run with it trains exactly like one without. It draws
its samples from a generator of its own, seeded from (seed, step) and never from the training
streams (prompts, sampling, shuffling, torch's global RNG), and runs in eval mode without
gradients. Seeding from the step also makes a resumed run reproduce the same numbers, even for
an evaluation that a stop interrupted and the resumed run does again.

Both results are written beside `metrics.jsonl` (`eval.jsonl`, `samples.jsonl`), one JSON line
per step, truncated past the checkpoint on resume as the metrics are, so a resumed run's files
equal an uninterrupted one's.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict

import torch

from core.config import TrainConfig
from core.models.base import CausalLM, encode_example
from core.rollout import StopRequested, generate
from core.tasks.base import Example, Task

PASS_REWARD = 1.0 - 1e-6
"""A completion passes (for pass@k) when its reward is at least this: full credit. Partial
credit (a positional match, a length penalty) is not a solved problem, so `reward > 0.5` would
count a 3-of-4 digits answer as solved; the tolerance only absorbs rounding in weighted sums of
grader scores."""

SAMPLE_TEXT_CHARS = 2000
"""Longest prompt, answer or completion text in a `samples` row; longer ones are cut (and the
row marked `truncated`) so that an event stays small whatever the dataset holds."""

SAMPLES_TEXT_BUDGET = 24_000
"""Characters of text in one `samples` event, all its triples together: with many triples each
text gets less than SAMPLE_TEXT_CHARS (64 triples: 125 characters each). Events are replayed
in pages of hundreds to every reconnecting stream, so their size is bounded, not just typical."""


class Sample(TypedDict):
    """One prompt/completion/reward triple of a step's rollout, as stored and published."""

    prompt: str  # the prompt text; chat turns as `role: content` lines
    answer: str  # the reference answer, "" when the record has none
    completion: str
    reward: float
    truncated: bool  # some text above was cut to SAMPLE_TEXT_CHARS


@dataclass(frozen=True)
class StepRollout:
    """What one step sampled, kept by the trainer for `samples`: examples and completions group
    after group (each example repeated `group_size` times), with their rewards."""

    examples: Sequence[Example]
    completions: Sequence[Sequence[int]]
    rewards: Sequence[float]


class ResultSink(Protocol):
    """Where results go: the trainer's callback satisfies it (a protocol, so that this module
    does not import the trainer that imports it)."""

    def on_eval(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_samples(self, step: int, samples: list[Sample]) -> None: ...

    def on_warning(self, message: str) -> None: ...

    def should_stop(self) -> bool: ...


# -- pure parts -----------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from n samples of which c pass (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code"): 1 - C(n - c, k) / C(n, k), as a running product
    so that no binomial coefficient is ever formed."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_ks(n: int) -> list[int]:
    """The k of the pass@k reported for n samples per prompt: 1, the powers of two below n, and
    n itself; none for n = 1 (pass@1 of one sample is the pass rate, not worth a second name)."""
    if n < 2:
        return []
    ks = {n}
    k = 1
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def eval_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s evaluation generator: a hash of (seed, step), so evaluations
    differ from one step to the next, never collide with the trainer's seed + 0..3 streams, and
    repeat exactly when a resumed run evaluates a step again. 63 bits: torch's seed range."""
    digest = hashlib.sha256(f"pdppo-eval:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def prompt_text(example: Example) -> str:
    """What a person reads as the prompt: the text, or the chat turns one per line."""
    if example.messages is None:
        return example.prompt
    return "\n".join(f"{m['role']}: {m['content']}" for m in example.messages)


def _cut(text: str, chars: int) -> tuple[str, bool]:
    if len(text) <= chars:
        return text, False
    return text[:chars], True


def make_sample(
    example: Example, completion: str, reward: float, chars: int = SAMPLE_TEXT_CHARS
) -> Sample:
    """The triple, each text cut to `chars` characters."""
    prompt, cut_prompt = _cut(prompt_text(example), chars)
    answer, cut_answer = _cut(example.answer, chars)
    text, cut_completion = _cut(completion, chars)
    return Sample(
        prompt=prompt,
        answer=answer,
        completion=text,
        reward=float(reward),
        truncated=cut_prompt or cut_answer or cut_completion,
    )


def pick_samples(
    rollout: StepRollout, group_size: int, count: int, decode: Callable[[list[int]], str]
) -> list[Sample]:
    """`count` triples of a step's rollout: the first completion of each group, then the second
    of each, and so on, so that a few samples show as many different prompts as possible. Texts
    share SAMPLES_TEXT_BUDGET."""
    n = len(rollout.completions)
    if n % group_size:
        raise ValueError(f"{n} completions are not whole groups of {group_size}")
    groups = n // group_size
    rows = [g * group_size + j for j in range(group_size) for g in range(groups)][:count]
    chars = min(SAMPLE_TEXT_CHARS, SAMPLES_TEXT_BUDGET // (3 * max(len(rows), 1)))
    return [
        make_sample(
            rollout.examples[i], decode(list(rollout.completions[i])), rollout.rewards[i], chars
        )
        for i in rows
    ]


# -- evaluation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scored:
    rewards: list[float]  # one per completion, in row order
    metrics: dict[str, float]  # the grading's own metrics, averaged over all rows
    tokens: int  # generated tokens (EOS excluded)


class Evaluator:
    """Evaluates a policy on the task's fixed held-out set (the first `eval_max_prompts`)."""

    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        lm: CausalLM,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.lm = lm
        self.should_stop = should_stop
        self.examples: list[Example] = list(task.held_out())[: cfg.eval_max_prompts]
        self._prompts = [encode_example(lm.tokenizer, e) for e in self.examples]
        # the rollout's batch size: what a worker's memory budget already allows per forward
        self.batch_rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size

    def evaluate(self, step: int) -> dict[str, float]:
        """The `eval_*` metrics of the policy as it is now. Raises StopRequested when
        `should_stop` says so (asked before every batch and every generated token)."""
        if not self.examples:
            raise ValueError("the task has no held-out examples to evaluate on")
        t0 = time.perf_counter()
        cfg = self.cfg
        k = cfg.eval_samples
        module = self.lm.module
        was_training = module.training
        module.eval()
        try:
            generator = torch.Generator(device=self.lm.device)
            generator.manual_seed(eval_seed(cfg.seed, step))
            rows = [i for i in range(len(self.examples)) for _ in range(k)]
            sampled = self._complete(rows, greedy=False, generator=generator)
            greedy = (
                self._complete(list(range(len(self.examples))), greedy=True, generator=None)
                if cfg.eval_greedy
                else None
            )
        finally:
            module.train(was_training)
        n = len(self.examples)
        out: dict[str, float] = {
            "eval_prompts": float(n),
            "eval_reward_mean": sum(sampled.rewards) / len(sampled.rewards),
            "eval_response_len": sampled.tokens / len(sampled.rewards),
        }
        passed = [
            sum(r >= PASS_REWARD for r in sampled.rewards[i * k : (i + 1) * k]) for i in range(n)
        ]
        for kk in pass_ks(k):
            out[f"eval_pass@{kk}"] = sum(pass_at_k(k, c, kk) for c in passed) / n
        out.update({f"eval_{name}": v for name, v in sampled.metrics.items()})
        if greedy is not None:
            out["eval_greedy_reward_mean"] = sum(greedy.rewards) / n
            out.update({f"eval_greedy_{name}": v for name, v in greedy.metrics.items()})
        out["eval_time"] = time.perf_counter() - t0
        return out

    def _complete(
        self, rows: list[int], *, greedy: bool, generator: torch.Generator | None
    ) -> _Scored:
        """Completions of the held-out prompts `rows` (indices, repeats allowed), batch after
        batch, graded batch by batch (a grader's metrics are batch averages: re-weighted by
        batch size here)."""
        r = self.cfg.rollout
        tok = self.lm.tokenizer
        rewards: list[float] = []
        sums: dict[str, float] = {}
        tokens = 0
        for start in range(0, len(rows), self.batch_rows):
            if self.should_stop is not None and self.should_stop():
                raise StopRequested("stopped during the evaluation")
            part = rows[start : start + self.batch_rows]
            batch = generate(
                self.lm,
                [self._prompts[i] for i in part],
                max_new_tokens=r.max_new_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                top_k=1,  # nothing trains on these rows: the smallest behavior view
                generator=generator,
                should_stop=self.should_stop,
                greedy=greedy,
            )
            texts = [tok.decode(c) for c in batch.completions]
            grades = self.task.grade([self.examples[i] for i in part], texts)
            rewards += [float(x) for x in grades.rewards]
            tokens += sum(len(c) for c in batch.completions)
            for name, value in grades.metrics.items():
                sums[name] = sums.get(name, 0.0) + value * len(part)
        return _Scored(rewards, {name: v / len(rows) for name, v in sums.items()}, tokens)


# -- the run's result files -----------------------------------------------------------------


class RunResults:
    """`eval.jsonl` and `samples.jsonl` of a run, when each is due, and handing them on.

    The trainer calls `reset` (fresh run) or `resume(step)`, then `after_step` once per step and
    `evaluate_if_owed` after it; both may raise StopRequested from inside an evaluation."""

    def __init__(self, cfg: TrainConfig, out_dir: Path, task: Task, lm: CausalLM, sink: ResultSink):
        self.cfg = cfg
        self.sink = sink
        self.decode = lm.tokenizer.decode
        self.eval_path = out_dir / "eval.jsonl"
        self.samples_path = out_dir / "samples.jsonl"
        self.evaluator = Evaluator(cfg, task, lm, sink.should_stop) if cfg.eval_every else None
        self.last_eval_step = -1  # step 0 is the starting policy (`eval_on_start`)
        if self.evaluator is not None and not self.evaluator.examples:
            sink.on_warning(
                f"eval_every={cfg.eval_every}: the task's held-out set is empty (too few "
                "records for task.validation_fraction, or an empty validation file); the run "
                "is not evaluated"
            )
            self.evaluator = None

    def reset(self) -> None:
        """A fresh run owns its output dir: results of an earlier run there are dropped."""
        self.eval_path.write_text("", encoding="utf-8")
        self.samples_path.write_text("", encoding="utf-8")
        self.last_eval_step = -1

    def resume(self, step: int) -> None:
        """Forget what was written past the checkpoint `step` (those steps run again)."""
        truncate_rows(self.eval_path, step)
        truncate_rows(self.samples_path, step)
        self.last_eval_step = last_row_step(self.eval_path)

    def eval_due(self, step: int) -> bool:
        every = self.cfg.eval_every
        if self.evaluator is None or not every or step < 0:
            return False
        if step == 0:
            return self.cfg.eval_on_start
        return step % every == 0 or step == self.cfg.steps

    def owes(self, step: int) -> bool:
        """`step`'s evaluation is due and not done yet (a resumed run owes the evaluation a
        stop interrupted)."""
        return self.eval_due(step) and step > self.last_eval_step

    def evaluate_if_owed(self, step: int) -> dict[str, float] | None:
        """Evaluates `step` when it `owes` it; None when nothing was owed."""
        if not self.owes(step):
            return None
        assert self.evaluator is not None
        metrics = self.evaluator.evaluate(step)
        _append(self.eval_path, {"step": step, **metrics})
        self.last_eval_step = step
        self.sink.on_eval(step, metrics)
        return metrics

    def after_step(self, step: int, rollout: StepRollout | None) -> None:
        """The step's samples, when they are due (and the trainer kept its rollout)."""
        every = self.cfg.log_samples_every
        if not every or step % every or rollout is None:
            return
        samples = pick_samples(
            rollout, self.cfg.rollout.group_size, self.cfg.log_samples_count, self.decode
        )
        _append(self.samples_path, {"step": step, "samples": samples})
        self.sink.on_samples(step, samples)


def _append(path: Path, row: object) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def truncate_rows(path: Path, step: int) -> None:
    """Drop the rows of a `{"step": ...}` JSONL file past `step`, and a line torn by a kill."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue
        if row_step <= step:
            keep.append(line)
    path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


def last_row_step(path: Path) -> int:
    """The step of the last row of a `{"step": ...}` JSONL file; -1 when it has none (a row
    of step 0 is the starting policy's evaluation)."""
    if not path.exists():
        return -1
    last = -1
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            last = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return last
