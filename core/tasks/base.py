"""A task draws prompts and scores completions with a verifiable reward in [0, 1]."""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = Mapping[str, str]
"""One chat turn, `{"role": "system" | "user" | "assistant", "content": "..."}`."""


@dataclass(frozen=True)
class Example:
    """One prompt: plain text (`prompt`) or chat turns (`messages`, rendered with the model's chat
    template), its reference `answer` when the task has one, and the whole dataset record, which
    graders read (test cases, a JSON schema, anything the dataset carries).

    `chat_optional`: the turns are rendered only by a model that has a chat template, and any
    other model gets `prompt` (a generated task asks its question either way); without it, a
    model with no template cannot take the turns (a dataset's chat records need one)."""

    prompt: str
    answer: str = ""
    messages: tuple[Message, ...] | None = None
    record: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    chat_optional: bool = False


@dataclass
class Grades:
    """Rewards of a batch of completions, with what the grading itself reports as metrics
    (per-grader scores `grader/<name>`, `grader_errors`, `grader_timeouts`), averaged over the
    batch."""

    rewards: list[float]
    metrics: dict[str, float] = field(default_factory=dict)


class Task(abc.ABC):
    name: str

    @abc.abstractmethod
    def sample(self, rng: random.Random) -> Example:
        """One prompt with its reference answer, drawn from `rng` only (for reproducible runs)."""

    @abc.abstractmethod
    def score(self, example: Example, completion: str) -> float:
        """Reward in [0, 1] for `completion` (text before EOS)."""

    def grade(self, examples: Sequence[Example], completions: Sequence[str]) -> Grades:
        """Rewards of many completions at once: tasks whose graders can fail, hang or report
        parts (JSONL with `task.grader`) override this; the default scores one by one."""
        return Grades([self.score(e, c) for e, c in zip(examples, completions, strict=True)])

    def held_out(self) -> Sequence[Example]:
        """The fixed evaluation set (a validation file, or the held-out fraction); empty when
        the task has none."""
        return ()

    def close(self) -> None:
        """Frees what the task holds beyond memory (a JSONL task's grading server); the
        trainer calls it when the run ends, however it ends."""
        return None

    def warmup_completion(self, example: Example, rng: random.Random) -> str:
        """A completion with the answer's shape but not its content, for the format warm-up."""
        raise NotImplementedError(f"task {self.name!r} has no format warm-up")


def positional_credit(pred: str, target: str) -> float:
    """Fraction of matching positions over the longer string: extra or missing chars cost."""
    if not pred and not target:
        return 1.0
    hits = sum(a == b for a, b in zip(pred, target, strict=False))
    return hits / max(len(pred), len(target))
