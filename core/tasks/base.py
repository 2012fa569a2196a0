"""A task draws prompts and scores completions with a verifiable reward in [0, 1]."""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


class Task(abc.ABC):
    name: str

    @abc.abstractmethod
    def sample(self, rng: random.Random) -> Example:
        """One prompt with its reference answer, drawn from `rng` only (for reproducible runs)."""

    @abc.abstractmethod
    def score(self, example: Example, completion: str) -> float:
        """Reward in [0, 1] for `completion` (text before EOS)."""

    def warmup_completion(self, example: Example, rng: random.Random) -> str:
        """A completion with the answer's shape but not its content, for the format warm-up."""
        raise NotImplementedError(f"task {self.name!r} has no format warm-up")


def positional_credit(pred: str, target: str) -> float:
    """Fraction of matching positions over the longer string: extra or missing chars cost."""
    if not pred and not target:
        return 1.0
    hits = sum(a == b for a, b in zip(pred, target, strict=False))
    return hits / max(len(pred), len(target))
