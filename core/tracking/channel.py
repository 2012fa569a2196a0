"""One tracker's reports, queued by the training thread and delivered by a thread of their own.

Training never waits on a tracker (as it never waits on Redis,
docs/developers/design.md#redis-outages): `put` appends to a bounded queue and returns. The
channel's thread opens the tracker's run and delivers the reports in order; a report that fails (the
tracker is down, slow, or refuses) is tried again after a wait that doubles up to a bound, and the
reports behind it wait. While the tracker is away the queue fills, and once full the oldest report
is dropped for each new one, and counted: the run's log says how many (`core.tracking.reporter`).
Closing waits a bounded time for the queue to empty, then abandons what is left (counted as dropped
too) and the thread with it: a thread stuck in a tracker's network call is a daemon, and ends with
the process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from core.tracking.base import Tracker, TrackerRun, TrackingOptions

log = logging.getLogger(__name__)
T = TypeVar("T")


BATCH = 100
"""At most this many steps' metrics go to a tracker together."""


def _send(batch: list[Report], tracker: Tracker) -> None:
    if len(batch) == 1:
        batch[0].send(tracker)
    else:
        tracker.metrics_many([r.metrics for r in batch if r.metrics is not None])


class Abandoned:
    """What a call tried until the channel was abandoned returns instead of a value."""


@dataclass(frozen=True)
class Report:
    """One thing to tell a tracker. `kind` and `key` (a step, a config version) make it
    idempotent across a resume: a report whose key is not past what the tracker's run took of
    that kind already (`TrackerRun.delivered`) is skipped."""

    kind: str
    key: int
    send: Callable[[Tracker], None]
    # a step's or an evaluation's numbers: sent together with the ones queued behind it
    # (`Tracker.metrics_many`, one request to MLflow for many steps while it catches up)
    metrics: tuple[int, Mapping[str, float]] | None = None


class Channel:
    def __init__(
        self,
        tracker: Tracker,
        options: TrackingOptions,
        previous: TrackerRun | None,
        resume_step: int | None,
        on_delivered: Callable[[Channel], None],
    ) -> None:
        self.tracker = tracker
        self.name = tracker.name
        self.options = options
        self.previous = previous
        self.resume_step = resume_step
        self.on_delivered = on_delivered
        self.run: TrackerRun | None = None
        self.delivered = 0
        self.dropped = 0
        self.failures = 0
        self.last_error: str | None = None
        self._queue: deque[Report] = deque()
        self._inflight: list[Report] = []  # taken from the queue, not yet delivered
        self._cond = threading.Condition()
        self._closing = False
        self._abandoned = False
        self._thread = threading.Thread(
            target=self._drain, name=f"pdppo tracker {self.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def put(self, report: Report) -> None:
        """Queue `report`; never blocks. A full queue drops its oldest report."""
        with self._cond:
            if self._closing:
                self.dropped += 1
                return
            if len(self._queue) >= self.options.queue_size:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(report)
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self, deadline: float) -> bool:
        """Deliver what is queued and close the tracker's run, waiting until `deadline`
        (`time.monotonic()`); False when it had to give up (what was left is dropped)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.ident is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():
            return True
        with self._cond:
            self._abandoned = True
            self.dropped += len(self._queue) + len(self._inflight)
            self._queue.clear()
            self._cond.notify_all()
        return False

    def _drain(self) -> None:
        run = self._retried(lambda: self.tracker.open(self.previous, self.resume_step))
        if isinstance(run, Abandoned):
            return
        self.run = run
        self.on_delivered(self)  # the run is known: its id is saved and told
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    break
                batch = self._take(run)
                if not batch:
                    continue  # taken by the run before a resume
                self._inflight = batch
            if isinstance(self._retried(partial(_send, batch, self.tracker)), Abandoned):
                return  # counted as dropped by `close`
            with self._cond:
                if self._abandoned:  # `close` counted them as dropped: they made it after all
                    self.dropped -= len(batch)
                self._inflight = []
                for report in batch:
                    run.delivered[report.kind] = max(report.key, run.delivered.get(report.kind, -1))
                self.delivered += len(batch)
            self.on_delivered(self)
        self._retried(self.tracker.close)

    def _take(self, run: TrackerRun) -> list[Report]:
        """The next report to send (under the lock), with the metric reports right behind
        it when it is one (up to `BATCH`); none when the run took it before a resume."""
        report = self._queue.popleft()
        if report.key <= run.delivered.get(report.kind, -1):
            return []
        batch = [report]
        while report.metrics is not None and self._queue and len(batch) < BATCH:
            after = self._queue[0]
            if after.metrics is None:
                break
            self._queue.popleft()
            if after.key > run.delivered.get(after.kind, -1):
                batch.append(after)
        return batch

    def _retried(self, call: Callable[[], T]) -> T | Abandoned:
        """`call()`'s value, tried again after each failure until it succeeds or the channel
        is abandoned."""
        wait = self.options.retry_seconds
        while True:
            try:
                value = call()
            except Exception as exc:  # a tracker's failure is never the run's
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("tracker %s: %s; trying again in %.1f s", self.name, exc, wait)
            else:
                return value
            with self._cond:
                if self._cond.wait_for(lambda: self._abandoned, timeout=wait):
                    return Abandoned()
            wait = min(wait * 2, self.options.max_retry_seconds)
