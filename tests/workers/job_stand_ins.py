"""Job processes that do not train: `finish_after_two_seconds` and `report_the_stop` stand in
for `workers.job.process.job_main` in tests/workers/test_supervise.py, so the worker's loop
around its job is tried on a real process from the real fork server in seconds."""

from __future__ import annotations

from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

RESULT = {"kind": "result", "outcome": "succeeded", "step": 3}


def finish_after_two_seconds(options: Any, conn: Connection, stop: Event, *_: Any) -> None:
    """Two seconds of "training" (less if asked to stop), then success at step 3."""
    stop.wait(2.0)
    conn.send(RESULT)


def report_the_stop(options: Any, conn: Connection, stop: Event, cancelled: Event) -> None:
    """Waits (up to 10 s) to be asked to stop, writes whether the stop keeps the work ("kept")
    or not ("cancelled") to stop.txt in its job folder, and reports a stop at step 2."""
    stop.wait(10.0)
    kept = "cancelled" if cancelled.is_set() else "kept" if stop.is_set() else "never asked"
    (Path(options.out_dir) / "stop.txt").write_text(kept)
    conn.send({"kind": "result", "outcome": "stopped", "step": 2})
