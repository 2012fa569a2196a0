"""When a lease's heartbeat tried to renew it: the lease tests' view of its timing."""

from __future__ import annotations

import time

from workers.job.lease import Lease


def record_renewals(lease: Lease) -> list[float]:
    """The monotonic times at which `lease`'s heartbeat starts each renewal, from now on (the
    list fills as it runs); failed renewals count too."""
    started: list[float] = []
    renew = lease.renew

    def timed() -> bool:
        started.append(time.monotonic())
        return renew()

    lease.renew = timed  # type: ignore[method-assign]
    return started
