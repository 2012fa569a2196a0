"""Graders that compare text: `string_check`, `regex`, `length_penalty`."""

from __future__ import annotations

import re
from functools import lru_cache

from core.config.graders import LengthPenaltyGrader, RegexGrader, StringCheckGrader
from core.graders.base import Grader, Record, text_field


class StringCheck(Grader):
    """Equality or containment of the stripped completion and the stripped reference.

    Linear in the text lengths (`in` is two-way search since CPython 3.10), so it runs in the
    trainer's process."""

    isolated = False

    def __init__(self, cfg: StringCheckGrader) -> None:
        self.cfg = cfg

    def check(self, record: Record) -> None:
        text_field(record, self.cfg.field)

    def score(self, completion: str, record: Record) -> float:
        got, want = completion.strip(), text_field(record, self.cfg.field).strip()
        if not self.cfg.case_sensitive:
            got, want = got.casefold(), want.casefold()
        if self.cfg.operation == "equals":
            return float(got == want)
        return float(want in got)


class Regex(Grader):
    """A pattern, fixed or from the record, that must match the stripped completion.

    Python's `re` backtracks: `(a+)+$` on a long run of "a" followed by "!" runs for longer than
    the universe, and cannot be interrupted inside the match. So regexes run in the grading
    server, under its deadline."""

    def __init__(self, cfg: RegexGrader) -> None:
        self.cfg = cfg
        self.flags = 0 if cfg.case_sensitive else re.IGNORECASE
        # a fixed pattern compiles: the config checked it (`compile_regex`)
        self.fixed = None if cfg.pattern is None else re.compile(cfg.pattern, self.flags)

    def check(self, record: Record) -> None:
        if self.fixed is None:
            pattern = text_field(record, self.cfg.field)
            try:
                _compile(pattern, self.flags)
            except re.error as e:
                raise ValueError(f"field {self.cfg.field!r} is not a regex ({e})") from None

    def score(self, completion: str, record: Record) -> float:
        pattern = self.fixed or _compile(text_field(record, self.cfg.field), self.flags)
        text = completion.strip()
        found = pattern.fullmatch(text) if self.cfg.mode == "fullmatch" else pattern.search(text)
        return float(found is not None)


@lru_cache(maxsize=1024)
def _compile(pattern: str, flags: int) -> re.Pattern[str]:
    """A record's pattern, compiled once per process however many completions it grades."""
    return re.compile(pattern, flags)


class LengthPenalty(Grader):
    """1 up to `max_chars` characters, then linearly down to 0 at twice that."""

    isolated = False

    def __init__(self, cfg: LengthPenaltyGrader) -> None:
        self.max_chars = cfg.max_chars

    def score(self, completion: str, record: Record) -> float:
        over = len(completion) - self.max_chars
        return min(1.0, max(0.0, 1.0 - over / self.max_chars))
