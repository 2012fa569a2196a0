"""Publishing a new job's Celery task off the request path.

`POST /v1/jobs` writes the job and its outbox entry in one Redis call; from then on the job runs
whatever happens to this process (a worker's dispatcher publishes what nobody did within
PDPPO_OUTBOX_GRACE_SECONDS, `pdppo.store.jobs.outbox`). Publishing right away is only the fast path,
so a request need not wait for it: kombu's publisher is blocking, and under 50 concurrent
submissions the thread hop and the GIL contention of a publish per request were most of the
tail latency. One thread here publishes in arrival order; the request only appends to a queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Publish = Callable[[str, str, int], None]
_STOP = ("", "", 0)


class TaskPublisher:
    """A daemon thread that sends each submitted (job id, queue, priority) with `publish`. A
    failure is logged and left to the outbox dispatcher; `close` publishes what is queued, up to
    a time limit (what it leaves, the dispatcher sends)."""

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._queue: queue.SimpleQueue[tuple[str, str, int]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="pdppo task publisher", daemon=True)
        self._thread.start()

    def submit(self, job_id: str, queue_name: str, priority: int = 0) -> None:
        """Never blocks: called from the event loop. `priority`: `workers.celery_app`'s."""
        self._queue.put((job_id, queue_name, priority))

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("task publisher: still publishing after %.0fs; the outbox will", timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item == _STOP:
                return
            job_id, queue_name, priority = item
            started = time.monotonic()
            try:
                self._publish(job_id, queue_name, priority)
            except Exception:
                log.warning(
                    "could not publish the task of job %s; the outbox dispatcher will",
                    job_id,
                    exc_info=True,
                )
            else:
                took = time.monotonic() - started
                if took > 1.0:
                    log.info("task publisher: publishing job %s took %.1fs", job_id, took)
