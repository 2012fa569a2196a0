"""Graders that compare answers as numbers: `numeric` (within a tolerance) and `math`
(symbolic equivalence, with math-verify)."""

from __future__ import annotations

import logging
import math
import re
from collections import deque
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from core.config.graders import MathGrader, NumericGrader
from core.extras import require
from core.graders.base import Grader, Record, field_value, text_field

NUMBER = re.compile(
    r"""
    (?:(?<![\w)])[-+])?                 # a sign, unless it is a minus between two terms: 5-3
    (?: \d{1,3}(?:,\d{3})+(?!\d)        # 1,234 and 1,234,567 (groups of exactly three)
          (?:\.\d+)?
      | \d+(?:\.\d*)?                   # 42, 42.5, and "42." at the end of a sentence
      | \.\d+ )                         # .5
    (?:[eE][-+]?\d+)?                   # 1e-3
    """,
    re.VERBOSE,
)
"""A number as written in prose. Every repetition is anchored on a digit or a comma, so the
search is linear in the text: the default extraction can run in the trainer's process."""


def parse_number(text: str) -> float | None:
    """The number `text` holds ("1,234.5", " -3 ", "1e3"), or None; never raises."""
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class Numeric(Grader):
    """1 when the completion's answer is within `tolerance` (or `relative_tolerance` times the
    reference) of the record's number.

    The answer is the last number in the completion, or the group of the last match of
    `extract`. Without `extract` the work is linear and runs in the trainer's process; a custom
    `extract` is a regex, which can backtrack without bound, so it runs in the grading server."""

    def __init__(self, cfg: NumericGrader) -> None:
        self.cfg = cfg
        # compiles, with its one group: the config checked it (`NumericGrader._one_group`)
        self.extract = None if cfg.extract is None else re.compile(cfg.extract)
        self.isolated = self.extract is not None

    def check(self, record: Record) -> None:
        self.reference(record)

    def reference(self, record: Record) -> float:
        value = field_value(record, self.cfg.field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            want = float(value) if math.isfinite(value) else None
        elif isinstance(value, str):
            want = parse_number(value)
        else:
            want = None
        if want is None:
            raise ValueError(f"field {self.cfg.field!r}={value!r} is not a finite number")
        return want

    def answer(self, completion: str) -> float | None:
        """The number the completion gives as its answer, or None when it gives none."""
        if self.extract is None:
            last = deque(NUMBER.finditer(completion), maxlen=1)
            return parse_number(last[0].group()) if last else None
        last = deque(self.extract.finditer(completion), maxlen=1)
        if not last or last[0].group(1) is None:
            return None
        return parse_number(last[0].group(1))

    def score(self, completion: str, record: Record) -> float:
        want, got = self.reference(record), self.answer(completion)
        if got is None:
            return 0.0
        error = abs(got - want)
        return float(
            error <= self.cfg.tolerance or error <= self.cfg.relative_tolerance * abs(want)
        )


class Math(Grader):
    """1 when math-verify finds the completion's final answer (the last `\\boxed{}`, else the
    last expression) equal to the reference: `1/2`, `0.5`, `\\frac{1}{2}` are one answer.

    math-verify and sympy are imported on first use, in the grading server only. Their own
    time limits (signal.alarm) are turned off: the server's deadline kills a stuck comparison,
    and alarms do not work outside the main thread."""

    def __init__(self, cfg: MathGrader, where: str) -> None:
        require(f"{where} (math)", "math", ("math_verify",))
        self.field = cfg.field
        self._parse: Callable[..., list[Any]] | None = None
        self._verify: Callable[..., bool] | None = None

    def check(self, record: Record) -> None:
        text_field(record, self.field)

    def _load(self) -> tuple[Callable[..., list[Any]], Callable[..., bool]]:
        if self._parse is None or self._verify is None:
            # math-verify warns once that its own timeout is off: that is on purpose here
            logging.getLogger("math_verify").setLevel(logging.ERROR)
            from math_verify import parse, verify

            self._parse, self._verify = parse, verify
        return self._parse, self._verify

    def gold(self, reference: str) -> list[Any]:
        """The reference as math-verify reads it; a bare expression (`x^2+1`, which its LaTeX
        extraction skips outside `$...$`) is read again as LaTeX."""
        return _gold(reference, self._load()[0])

    def score(self, completion: str, record: Record) -> float:
        parse, verify = self._load()
        reference = text_field(record, self.field)
        gold = self.gold(reference)
        if not gold:
            raise ValueError(f"math-verify reads no answer in field {self.field!r}={reference!r}")
        answer = parse(completion, parsing_timeout=None)
        return float(bool(answer) and verify(gold, answer, timeout_seconds=None))


@lru_cache(maxsize=4096)
def _gold_cached(reference: str, parse: Callable[..., list[Any]]) -> tuple[Any, ...]:
    found = parse(reference, parsing_timeout=None)
    if not found:
        found = parse(f"${reference}$", parsing_timeout=None)
    return tuple(found)


def _gold(reference: str, parse: Callable[..., list[Any]]) -> list[Any]:
    """Parsed once per process: a group of completions shares its reference."""
    return list(_gold_cached(reference, parse))
