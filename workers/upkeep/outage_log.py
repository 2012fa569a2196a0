"""How the worker's background loops log a Redis outage: its first failure with the traceback, a
line every `every` seconds while it lasts, and one when Redis answers again.

Why: the reaper and the dispatcher retry every second, and each failure was logged with its
traceback (about 15 lines): a worker's log filled with a traceback a second for as long as Redis
was down, burying the lines that said what happened to its jobs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

REPEAT_SECONDS = 30.0


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
        self.since: float | None = None  # when the outage began; None while Redis answers
        self.last = 0.0  # when it was last logged
        self.failures = 0

    def failed(self, exc: BaseException) -> None:
        now = self.clock()
        self.failures += 1
        if self.since is None:
            self.since, self.last, self.failures = now, now, 1
            self.log.warning("%s could not reach Redis; retrying", self.what, exc_info=exc)
        elif now - self.last >= self.every:
            self.last = now
            self.log.warning(
                "%s still cannot reach Redis after %.0fs (%d attempts; last: %s: %s)",
                self.what,
                now - self.since,
                self.failures,
                type(exc).__name__,
                exc,
            )

    def reached(self) -> None:
        if self.since is not None:
            self.log.warning(
                "%s reached Redis again after %.0fs (%d failed attempts)",
                self.what,
                self.clock() - self.since,
                self.failures,
            )
            self.since = None
