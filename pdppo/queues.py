"""Worker queues: which Celery queue a job waits on, and which queues a worker takes.

A job that needs N devices (`resources.gpus`) must go only to a worker that owns N, and holds
them all while it runs. A worker runs one job at a time (`pdppo worker`: `--pool solo`), so
"a worker with N free devices" is "an idle worker that declared at least N": jobs of N devices
wait on a queue of their own, `<device>.x<N>` (`gpu.x4`), and a worker that declared D devices
takes `<device>` and `<device>.x2` up to `<device>.x<D>`. One-device jobs keep the plain `cpu`
and `gpu` queues, so workers and jobs from before multi-device jobs route as they did.

No broker is asked which workers exist: the API refuses a job of more devices than
`PDPPO_MAX_JOB_DEVICES` (default 1), which the operator sets to what the largest worker has, so
a job never waits for a worker that no deployment of this configuration can have.
"""

from __future__ import annotations

import re
from typing import Literal, cast

Device = Literal["cpu", "gpu"]
DEVICES: tuple[Device, ...] = ("cpu", "gpu")
MAX_DEVICES = 64  # per job and per worker: one machine's worth
_QUEUE = re.compile(r"^(cpu|gpu)(?:\.x([2-9]|[1-5][0-9]|6[0-4]))?$")
QUEUE_PATTERN = _QUEUE.pattern


def job_queue(device: Device, devices: int = 1) -> str:
    """The queue a job of `devices` devices of kind `device` waits on."""
    if not 1 <= devices <= MAX_DEVICES:
        raise ValueError(f"devices must be 1 to {MAX_DEVICES}, not {devices}")
    return device if devices == 1 else f"{device}.x{devices}"


def parse_queue(queue: str) -> tuple[Device, int]:
    """(device kind, devices) of a queue name that `job_queue` made."""
    match = _QUEUE.match(queue)
    if match is None:
        raise ValueError(f"not a pdppo queue: {queue!r}")
    return cast(Device, match.group(1)), int(match.group(2) or 1)


def queue_device(queue: str) -> Device:
    return parse_queue(queue)[0]


def worker_queues(devices: list[Device], count: int) -> list[str]:
    """Every queue a worker owning `count` devices takes, for each kind it serves: every job
    that fits it. (Kombu's Redis transport takes turns between a worker's queues, so a big worker
    also runs small jobs; a deployment that wants its big workers kept for big jobs starts
    one-device workers beside them, which take the small jobs as fast.)"""
    if not 1 <= count <= MAX_DEVICES:
        raise ValueError(f"a worker declares 1 to {MAX_DEVICES} devices, not {count}")
    return [job_queue(d, n) for d in devices for n in range(count, 0, -1)]
