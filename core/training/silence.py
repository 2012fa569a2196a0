"""Telling a user early that a run learns nothing: every advantage of its first steps was zero.

GRPO's advantage is a completion's reward minus its group's mean, so a group whose completions
all scored the same teaches nothing, and a step where every group did has a zero gradient (a KL
penalty aside): the run spends its budget and ends exactly where it started, with metrics that
look healthy. The usual cause is a grader that never matches (every reward 0): an untrained model
on a free-form dataset rarely writes the answer in the expected format. `SilenceWatch` notices
when the first `train.silent_steps` steps were all like that and says so once, with what to try;
`run_warnings` gives the verdict on a finished run (a job that learned nothing still succeeds,
with these warnings in its record).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor


def zero_adv_groups(rewards: Tensor, group_size: int) -> float:
    """The fraction of groups whose rewards are all equal (so every advantage in them is 0),
    rewards (B,) laid out group after group."""
    r = rewards.view(-1, group_size)  # (G, group_size)
    same = r.max(dim=1).values == r.min(dim=1).values  # (G,)
    return float(same.float().mean())


class SilenceWatch:
    """Counts the leading steps whose every group had zero advantage; warns once at `steps`.

    Its state goes into checkpoints, so that a resumed run warns as an uninterrupted one would."""

    def __init__(self, steps: int, jsonl_task: bool) -> None:
        self.steps = steps  # 0: never warn
        self.jsonl_task = jsonl_task
        self.streak = 0  # leading silent steps so far; -1 once a step had some signal
        self.low = float("inf")  # lowest and highest reward seen over the streak
        self.high = float("-inf")

    def observe(self, rewards: Tensor, zero_fraction: float) -> str | None:
        """Record one finished step; the warning to give (once) when this step completes the
        silent streak, else None."""
        if self.steps == 0 or self.streak < 0:
            return None
        if zero_fraction < 1.0:
            self.streak = -1
            return None
        self.streak += 1
        self.low = min(self.low, float(rewards.min()))
        self.high = max(self.high, float(rewards.max()))
        return self.message() if self.streak == self.steps else None

    def message(self) -> str:
        """Why nothing is learned, and what to try, for the rewards seen."""
        n = self.steps
        first = "the first step" if n == 1 else f"the first {n} steps"
        head_start = (
            "start from a model that already answers in the expected format (an hf: model, or "
            "job:<id> of an earlier run)"
            if self.jsonl_task
            else "add task.warmup_steps (a short supervised warm-up on the answer format) or "
            "start from a model that already answers (job:<id> of an earlier run)"
        )
        if self.high == 0.0:
            return (
                f"reward was 0 on every completion of {first}: the grader never matched, so "
                f"every advantage is 0 and nothing is learned. An untrained model on a "
                f"free-form task rarely produces the answer format: {head_start}, or use a "
                f"grader that gives partial credit"
            )
        if self.low == self.high:
            return (
                f"reward was {self.low:g} on every completion of {first}: every advantage is 0 "
                f"and nothing is learned. The grader scores every completion alike; check "
                f"task.grader, or give it a task the model does not already solve"
            )
        return (
            f"in each of {first}, all completions of a prompt got the same reward (rewards "
            f"ranged from {self.low:g} to {self.high:g} across prompts): every advantage is 0 "
            f"and nothing is learned. Make completions differ: raise rollout.group_size or "
            f"rollout.temperature, or use a grader that gives partial credit"
        )

    def state(self) -> dict[str, Any]:
        return {"streak": self.streak, "low": self.low, "high": self.high}

    def restore(self, state: dict[str, Any] | None) -> None:
        """A checkpoint from before this watch existed has no state: stay quiet then (its
        first steps are past)."""
        if state is None:
            self.streak = -1
            return
        self.streak, self.low, self.high = state["streak"], state["low"], state["high"]


@dataclass(frozen=True)
class RunWarning:
    """Something a finished run should tell its user although it succeeded: a code to branch
    on and a sentence to read."""

    code: str  # no_reward_variance, rewards_all_zero, eval_unchanged
    message: str


def run_warnings(
    metrics: Sequence[Mapping[str, float]], evals: Sequence[Mapping[str, float]]
) -> list[RunWarning]:
    """What a finished run learned nothing from, judged on its whole history (`metrics.jsonl`
    and `eval.jsonl` rows, a resumed run's included), so that a run whose rewards never moved
    does not pass for a success. The watch above warns early; this is the verdict at the end."""
    out: list[RunWarning] = []
    n = len(metrics)
    if n and all(m.get("zero_adv_groups") == 1.0 for m in metrics):
        out.append(
            RunWarning(
                "no_reward_variance",
                f"in every one of the {n} steps, all completions of each prompt got the same "
                "reward: every advantage was 0, so the rewards taught the model nothing",
            )
        )
    if n and all(m.get("reward_mean") == 0.0 and m.get("reward_std") == 0.0 for m in metrics):
        out.append(
            RunWarning(
                "rewards_all_zero",
                f"every reward of all {n} steps was 0: the grader never matched a completion. "
                "Compare the samples with the task's answers and grader, or start from a model "
                "that already answers in the expected format",
            )
        )
    scores = [e["eval_reward_mean"] for e in evals if "eval_reward_mean" in e]
    if len(scores) >= 2 and len(set(scores)) == 1:
        out.append(
            RunWarning(
                "eval_unchanged",
                f"the held-out mean reward was {scores[0]:g} at each of the {len(scores)} "
                "evaluations: the policy did not get better or worse on held-out prompts",
            )
        )
    return out
