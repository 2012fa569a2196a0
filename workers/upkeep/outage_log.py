"""How the worker's background loops log a Redis outage: its first failure with the traceback, a
line every `every` seconds while it lasts, and one when Redis answers again.

Why: the reaper and the dispatcher retry every second, and each failure was logged with its
traceback (about 15 lines): a worker's log filled with a traceback a second for as long as Redis
was down, burying the lines that said what happened to its jobs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

REPEAT_SECONDS = 30.0


@dataclass
class _Outage:
    since: float  # its first failure
    last: float  # when it was last logged
    failures: int


class OutageLog:
    def __init__(
        self,
        what: str,
        log: logging.Logger,
        every: float = REPEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.log = log
        self.every = every
        self.clock = clock
        self.outage: _Outage | None = None  # None while Redis answers

    def failed(self, exc: BaseException) -> None:
        now = self.clock()
        outage = self.outage
        if outage is None:
            self.outage = _Outage(since=now, last=now, failures=1)
            self.log.warning("%s could not reach Redis; retrying", self.what, exc_info=exc)
            return
        outage.failures += 1
        if now - outage.last >= self.every:
            outage.last = now
            self.log.warning(
                "%s still cannot reach Redis after %.0fs (%d attempts; last: %s: %s)",
                self.what,
                now - outage.since,
                outage.failures,
                type(exc).__name__,
                exc,
            )

    def reached(self) -> None:
        if self.outage is not None:
            self.log.warning(
                "%s reached Redis again after %.0fs (%d failed attempts)",
                self.what,
                self.clock() - self.outage.since,
                self.outage.failures,
            )
            self.outage = None
