"""A job process that does not train: `finish_after_two_seconds` stands in for
`workers.job_process.job_main` in tests/workers/test_supervise.py, so the worker's loop around
its job is tried on a real process from the real fork server in seconds."""

from __future__ import annotations

from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

RESULT = {"kind": "result", "outcome": "succeeded", "step": 3}


def finish_after_two_seconds(options: Any, conn: Connection, stop: Event) -> None:
    """Two seconds of "training" (less if asked to stop), then success at step 3."""
    stop.wait(2.0)
    conn.send(RESULT)
