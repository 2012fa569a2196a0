"""`pdppo webhook-worker` (the real one: Celery, Redis, its scheduler thread) whose scheduler a
test can kill or stall from outside, to see what the container's healthcheck makes of it:

    python -m tests.integration.faulty_webhook_worker CONTROL_DIR NODE

Once `CONTROL_DIR/kill` exists, the scheduler's next pass raises SystemExit, which its loop
(built to outlive any Exception) does not catch: the thread ends, the process and its Celery
consumer live on. While `CONTROL_DIR/stall` exists, a pass hangs, as one waiting forever on a
socket would.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pdppo.cli import main
from workers import webhooks


def run(control: Path, node: str) -> None:
    real_pass = webhooks.Scheduler.pass_once

    def pass_once(self: webhooks.Scheduler, block_ms: int | None = None) -> int:
        if (control / "kill").exists():
            print("faulty webhook worker: the scheduler thread ends", flush=True)
            raise SystemExit(0)
        if (control / "stall").exists():
            print("faulty webhook worker: the scheduler stalls", flush=True)
            while (control / "stall").exists():
                time.sleep(0.1)
        return real_pass(self, block_ms=block_ms)

    webhooks.Scheduler.pass_once = pass_once  # type: ignore[method-assign]
    main(["webhook-worker", "--name", node, "--loglevel", "INFO"])


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2])
