"""A dataset task: one record per line (`core.tasks.records`), scored by the spec's grader.

Where the records come from: `task.path`, a file on the worker's disk (under its data roots), or
`task.file`, an uploaded file the worker fetched from its artifact store (`file_paths`, by id; no
data roots check: the worker put it there). Either way the file is opened through
`core.disk.safe_files`: a regular file only (never a FIFO or a device), of bounded size, read line
by line with a bounded line length.

Every record is read and checked when the task is built, so a bad dataset fails before any
training, with its line number: the record schema, and then the fields the grader will read (a
pattern that compiles, a number, a JSON schema that is one). Without `task.grader` the older
`task.match` compares the completion with the record's `answer`, which every record then needs.

Held-out records (`held_out()`, for evaluation) come from a validation file, or are a seeded
fraction of the dataset that training then never samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.config import TaskConfig
from core.config.graders import GraderConfig, RegexGrader
from core.disk.safe_files import DEFAULT_MAX_BYTES, DEFAULT_MAX_LINE_BYTES, iter_lines
from core.graders import BatchGrader, GraderOptions
from core.tasks.base import Example, Grades, Task
from core.tasks.records import numbered_records, to_example

Match = Literal["exact", "numeric", "regex"]


@dataclass(frozen=True)
class Source:
    """A JSONL file and how the spec names it (`what`, in every message about it)."""

    path: str | Path
    what: str
    data_roots: Sequence[str] | None = None
    """Folders its real path must lie under; None: anywhere (uploads, a local run)."""


class JsonlTask(Task):
    name = "jsonl"

    def __init__(
        self,
        source: Source | str | Path,
        match: Match = "exact",
        tolerance: float = 1e-6,
        *,
        grader: GraderConfig | None = None,
        grader_timeout_seconds: float = 5.0,
        grader_batch_timeout_seconds: float | None = None,
        grader_options: GraderOptions | None = None,
        validation: Source | None = None,
        validation_fraction: float = 0.0,
        seed: int = 0,
        data_roots: Sequence[str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        """Reads and checks every record now. A plain path is `task.path` under `data_roots`.

        `grader`: how completions are scored (unset: `match` on `answer`, which `match="regex"`
        runs as a `regex` grader on the record's `answer`, under the same deadline). The grading
        server, if the grader needs one, starts at the first `grade`; `close()` stops it.
        `grader_options`: what the operator lets OpenAI graders do (`core.graders.options`).
        `validation_fraction`: without a `validation` file, hold out this fraction of the
        records, chosen by `seed`."""
        if match not in ("exact", "numeric", "regex"):
            raise ValueError(f"task.match={match!r} must be exact, numeric or regex")
        if not 0.0 <= validation_fraction <= 0.5:
            raise ValueError(f"task.validation_fraction={validation_fraction} must be in [0, 0.5]")
        if not isinstance(source, Source):
            source = Source(source, f"task.path={str(source)!r}", data_roots)
        self.match = match
        self.tolerance = tolerance
        self.limits = (max_bytes, max_line_bytes)
        self.needs_answer = grader is None
        if grader is None and match == "regex":
            grader = RegexGrader(type="regex", field="answer", mode="fullmatch")
        self.grader = (
            None
            if grader is None
            else BatchGrader(
                grader,
                grader_timeout_seconds,
                batch_timeout_seconds=grader_batch_timeout_seconds,
                options=grader_options,
            )
        )
        try:
            examples = self._load(source)
            if not examples:
                raise ValueError(f"{source.what} holds no records")
            self.held: list[Example] = []
            if validation is not None:
                self.held = self._load(validation)
            elif validation_fraction:
                examples, self.held = _split(examples, validation_fraction, seed)
        except BaseException:
            self.close()
            raise
        self.examples = examples

    @classmethod
    def from_config(
        cls,
        cfg: TaskConfig,
        data_roots: Sequence[str] | None = None,
        file_paths: Mapping[str, Path] | None = None,
        seed: int = 0,
        grader_options: GraderOptions | None = None,
    ) -> JsonlTask:
        """The task of a `task.name='jsonl'` spec; a ValueError when it names an uploaded file
        that `file_paths` does not hold."""
        source = _source(
            cfg.path,
            cfg.file,
            "path",
            file_field="file",
            data_roots=data_roots,
            file_paths=file_paths,
        )
        if source is None:
            raise ValueError("task.name='jsonl' needs task.path or task.file")
        validation = _source(
            cfg.validation_path,
            cfg.validation_file,
            "validation_path",
            file_field="validation_file",
            data_roots=data_roots,
            file_paths=file_paths,
        )
        return cls(
            source,
            cfg.match,
            cfg.numeric_tolerance,
            grader=cfg.grader,
            grader_timeout_seconds=cfg.grader_timeout_seconds,
            grader_batch_timeout_seconds=cfg.grader_batch_timeout_seconds,
            grader_options=grader_options,
            validation=validation,
            validation_fraction=cfg.validation_fraction,
            seed=seed,
        )

    def _load(self, source: Source) -> list[Example]:
        max_bytes, max_line_bytes = self.limits
        lines = iter_lines(
            source.path,
            source.data_roots,
            what=source.what,
            max_bytes=max_bytes,
            max_line_bytes=max_line_bytes,
        )
        examples = []
        for lineno, record in numbered_records(lines, source.what):
            try:
                self._check(record)
            except ValueError as e:
                raise ValueError(f"{source.what} line {lineno}: {e}") from None
            examples.append(to_example(record))
        return examples

    def _check(self, record: dict[str, Any]) -> None:
        if self.needs_answer and "answer" not in record:
            raise ValueError(
                f"the record has no 'answer', which task.match={self.match!r} compares the "
                "completion with (or set task.grader)"
            )
        if self.grader is not None:
            self.grader.check(record)

    # -- Task ------------------------------------------------------------------------------

    def sample(self, rng: random.Random) -> Example:
        return self.examples[rng.randrange(len(self.examples))]

    def held_out(self) -> Sequence[Example]:
        return self.held

    def grade(self, examples: Sequence[Example], completions: Sequence[str]) -> Grades:
        """Never raises for a grader's sake: a grader that fails or runs out of time scores 0
        and counts in `grader_errors` / `grader_timeouts` (fractions of the batch)."""
        if self.grader is None:
            return super().grade(examples, completions)
        graded = self.grader.grade(completions, [e.record for e in examples])
        return Grades(graded.rewards, graded.metrics)

    def score(self, example: Example, completion: str) -> float:
        if self.grader is not None:
            return self.grade([example], [completion]).rewards[0]
        pred = completion.strip()
        if self.match == "exact":
            return float(pred == example.answer.strip())
        try:
            got, want = float(pred.replace(",", "")), float(example.answer.replace(",", ""))
        except ValueError:
            return 0.0
        return float(math.isfinite(got) and abs(got - want) <= self.tolerance)

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the grading server, if one was started; the task can still grade afterwards
        (it starts a new one)."""
        if self.grader is not None:
            self.grader.close()

    def __enter__(self) -> JsonlTask:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _source(
    path: str | None,
    file_id: str | None,
    path_field: str,
    file_field: str,
    data_roots: Sequence[str] | None,
    file_paths: Mapping[str, Path] | None,
) -> Source | None:
    if file_id is not None:
        if file_paths is None or file_id not in file_paths:
            raise ValueError(
                f"task.{file_field}={file_id!r}: that uploaded file was not given to the "
                "trainer (file_paths has no such id)"
            )
        return Source(file_paths[file_id], f"task.{file_field}={file_id!r}")
    if path is not None:
        return Source(path, f"task.{path_field}={path!r}", data_roots)
    return None


def _split(
    examples: list[Example], fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """(training, held out): `fraction` of the records (at least one), chosen by `seed` alone,
    each part in file order. The same dataset and seed always hold out the same records."""
    n = len(examples)
    k = max(1, round(fraction * n))
    if n - k < 1:
        raise ValueError(
            f"task.validation_fraction={fraction} of {n} record(s) leaves none for training"
        )
    order = list(range(n))
    random.Random(f"pdppo validation split {seed}").shuffle(order)
    held = set(order[:k])
    return (
        [e for i, e in enumerate(examples) if i not in held],
        [examples[i] for i in sorted(held)],
    )
