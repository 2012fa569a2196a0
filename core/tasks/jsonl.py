"""A dataset task: one JSON object per line with `prompt` and `answer`, scored by a rule."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

from core.tasks.base import Example, Task


class JsonlTask(Task):
    name = "jsonl"

    def __init__(self, path: str | Path, match: str = "exact", tolerance: float = 1e-6) -> None:
        if match not in ("exact", "numeric", "regex"):
            raise ValueError(f"task.match={match!r} must be exact, numeric or regex")
        self.match = match
        self.tolerance = tolerance
        self.examples: list[Example] = []
        with Path(path).open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.examples.append(Example(str(row["prompt"]), str(row["answer"])))
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(
                        f"task.path={str(path)!r} line {lineno}: expected an object with "
                        f"'prompt' and 'answer' ({e})"
                    ) from e
        if not self.examples:
            raise ValueError(f"task.path={str(path)!r} holds no examples")
        if match == "regex":
            for ex in self.examples:
                re.compile(ex.answer)

    def sample(self, rng: random.Random) -> Example:
        return self.examples[rng.randrange(len(self.examples))]

    def score(self, example: Example, completion: str) -> float:
        pred = completion.strip()
        if self.match == "exact":
            return float(pred == example.answer.strip())
        if self.match == "regex":
            return float(re.fullmatch(example.answer, pred) is not None)
        try:
            got, want = float(pred.replace(",", "")), float(example.answer.replace(",", ""))
        except ValueError:
            return 0.0
        return float(math.isfinite(got) and abs(got - want) <= self.tolerance)
