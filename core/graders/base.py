"""What every grader is: a score in [0, 1] for a completion and the record it answers.

A grader is built once from its config (`core.graders.build_grader`) and then called for many
completions, in the trainer's process or in the grading server (`core.graders.server`). It does
two things apart:

- `check(record)`, when the dataset is loaded: every field the grader will read is there and
  usable (a pattern compiles, a schema is a schema), so a bad record fails the job before
  training, with its line number, instead of scoring 0 for hours;
- `score(completion, record)` per completion. A *wrong* completion scores 0; an exception means
  the grader itself failed (a bug, a record the check let through), which the batch reports in
  `grader_errors` rather than as a low reward.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Record = Mapping[str, Any]
"""One dataset record (a parsed JSONL line), as graders read it."""


@dataclass(frozen=True)
class Scored:
    """A completion's score, with the sub-scores a `multi` grader reports (`grader/<name>`)."""

    value: float
    parts: dict[str, float] = field(default_factory=dict)


class Grader(abc.ABC):
    """One grader, built from its config; safe to call from one thread at a time."""

    isolated: bool = True
    """True when scoring can run for unbounded time or take the process down (a regex that
    backtracks, sympy, JSON-schema patterns, operator code), so it must run in the grading
    server, where a deadline can kill it. False only for graders whose work is linear in the
    completion and record lengths and that call no code but ours."""

    def check(self, record: Record) -> None:
        """Raises ValueError naming the field when `record` cannot be graded (load time)."""
        return None  # a grader that reads no field (length_penalty) has nothing to check

    @abc.abstractmethod
    def score(self, completion: str, record: Record) -> float:
        """The completion's score in [0, 1]; raises only when the grader itself fails."""

    def grade(self, completion: str, record: Record) -> Scored:
        """The score with its parts; only composed graders have parts."""
        return Scored(self.score(completion, record))

    def __call__(self, completion: str, record: Record) -> float:
        return self.score(completion, record)


class GraderLoadError(ValueError):
    """A tenant's python grader could not be loaded: its top level raised, ended the process,
    or did not finish in time. The tenant's to fix, so a job fails as `invalid_input` and
    graders.run answers 400; `where` is the grader's place in the spec (`...grader`)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


def field_value(record: Record, name: str) -> Any:
    """The record's field `name`, or a ValueError that names it (a missing field is the
    dataset's fault, said the same way by every grader)."""
    try:
        return record[name]
    except KeyError:
        raise ValueError(f"the record has no field {name!r}, which the grader reads") from None


def text_field(record: Record, name: str) -> str:
    """A field holding a string (numbers are taken as written in JSON: 4 is "4")."""
    value = field_value(record, name)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"field {name!r} must be a string or a number, not {_kind(value)}")
    return value if isinstance(value, str) else str(value)


def check_unit(value: float, what: str) -> float:
    """`value` when it is a finite number in [0, 1]; a grader returning anything else is a bug
    in that grader, not a reward."""
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} returned {value!r}, not a number in [0, 1]")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
