"""Admission by count, per tenant and per API process: at most `max_per_tenant` things of one
tenant at once (event streams, grader runs), and `max_total` of everyone's; past either, the
caller answers 429 with a Retry-After drawn from `retry_after` (refused clients then come back
spread out, not as one herd).

In-process counts, not Redis: what they protect is this process's own (its event loop and
connections, the child processes it starts), and a slot is given back however its request ends,
with no key left behind by a process that died. `pdppo serve --workers N` allows N times as
many. Event-loop only: `admit` and `release` are called from the loop's thread.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable


class LimitReached(Exception):
    """Refused: `limit` ("tenant" or "total") is reached, at `value`; try again after
    `retry_after` seconds."""

    def __init__(self, limit: str, value: int, retry_after: int) -> None:
        super().__init__(limit, value)
        self.limit, self.value, self.retry_after = limit, value, retry_after


class Slot:
    """An admitted thing; `release` (idempotent) gives its place back."""

    def __init__(self, slots: TenantSlots, tenant: str) -> None:
        self._slots: TenantSlots | None = slots
        self.tenant = tenant

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._release(self.tenant)


class TenantSlots:
    """Counts of what each tenant holds; `on_release(total)` is told each release, with the
    total held after it."""

    def __init__(
        self,
        max_total: int,
        max_per_tenant: int,
        retry_after: tuple[int, int],
        on_release: Callable[[int], None] | None = None,
    ) -> None:
        self.max_total = max_total
        self.max_per_tenant = max_per_tenant
        self.retry_after = retry_after
        self.on_release = on_release
        self.total = 0
        self._held: defaultdict[str, int] = defaultdict(int)

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def admit(self, tenant: str) -> Slot:
        """A place for one more of `tenant`'s, or LimitReached."""
        retry_after = random.randint(*self.retry_after)
        if self.total >= self.max_total:
            raise LimitReached("total", self.max_total, retry_after)
        if self._held[tenant] >= self.max_per_tenant:
            raise LimitReached("tenant", self.max_per_tenant, retry_after)
        self._held[tenant] += 1
        self.total += 1
        return Slot(self, tenant)

    def _release(self, tenant: str) -> None:
        self._held[tenant] -= 1
        if not self._held[tenant]:
            del self._held[tenant]
        self.total -= 1
        if self.on_release is not None:
            self.on_release(self.total)
