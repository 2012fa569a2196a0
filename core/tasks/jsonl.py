"""A dataset task: one JSON object per line with `prompt` and `answer`, scored by a rule.

The file is opened through `core.safe_files`: a regular file only (never a FIFO or a device),
under the data roots once symlinks are resolved (when the caller passes roots), of bounded size,
read line by line with a bounded line length. A bad line fails the run with its line number.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path

from core.safe_files import DEFAULT_MAX_BYTES, DEFAULT_MAX_LINE_BYTES, iter_lines
from core.tasks.base import Example, Task


class JsonlTask(Task):
    name = "jsonl"

    def __init__(
        self,
        path: str | Path,
        match: str = "exact",
        tolerance: float = 1e-6,
        *,
        data_roots: Sequence[str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        """Reads every example of `path` now, so a bad dataset fails before any training.

        `data_roots`: the folders the file's real path must lie under (None: anywhere).
        """
        if match not in ("exact", "numeric", "regex"):
            raise ValueError(f"task.match={match!r} must be exact, numeric or regex")
        self.match = match
        self.tolerance = tolerance
        self.examples: list[Example] = []
        what = f"task.path={str(path)!r}"
        lines = iter_lines(
            path, data_roots, what=what, max_bytes=max_bytes, max_line_bytes=max_line_bytes
        )
        for lineno, line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                example = Example(str(row["prompt"]), str(row["answer"]))
            # ValueError: bad JSON, or an integer too long to print; RecursionError: deeply
            # nested arrays (a 1 MiB line of "[" is valid input to the parser's recursion)
            except (ValueError, KeyError, TypeError, RecursionError) as e:
                raise ValueError(
                    f"{what} line {lineno}: expected an object with 'prompt' and 'answer' "
                    f"({type(e).__name__}: {str(e)[:200]})"
                ) from e
            if match == "regex":
                try:
                    re.compile(example.answer)
                except re.error as e:
                    raise ValueError(f"{what} line {lineno}: answer is not a regex ({e})") from e
            self.examples.append(example)
        if not self.examples:
            raise ValueError(f"{what} holds no examples")

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
