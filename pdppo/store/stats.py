"""Service counters and worker beats in Redis, for the API's `/metrics`
(`api.http.service_metrics`).

What an operator watches mostly happens outside the API: workers renew leases, requeue orphans,
send lost tasks; job processes grade completions; a job ends in whichever process finishes it.
The compose deployment runs one API and N workers (and a job process per running job), and only
the API has a port Prometheus scrapes. So every process adds its events to one Redis hash
(`STATS`, HINCRBY) and the API reads it at scrape time: one scrape target sees the whole
service, a counter survives the restart of the process that counted (Redis keeps it, so no
`rate()` reset on every worker restart), and no worker needs a port, a scrape config per
container, or a service discovery. The alternative, a metrics port per worker, would leave
the job processes (short-lived, several per worker) unscraped, and the jobs that end in the API
(a cancel) or in a reaper of another worker with no one to count them.

Counted where the change happens:
- a job's end (`ended|queue|status|code`) inside the Lua script that ends it (`COUNT_END`), so
  a job ended once is counted once, whoever ends it and whatever crashes after;
- everything else in a process-wide `Tally` of pending increments that the process flushes
  with one pipelined HINCRBY: a worker after each dispatcher pass (`beat`, every few seconds),
  a job process with each published step. A flush that fails keeps its increments for the next
  one; a flush whose reply was lost may count its increments twice (counters, not records).

Workers alive: each worker's dispatcher pass (which just reached Redis) also stamps the worker's
name in the sorted set `WORKERS` with the time, so the API sees who reached Redis lately,
without the heartbeat files (`workers.upkeep.heartbeat`) that live on each worker's own disk.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import cast

import redis

from pdppo.store.keys import STATS, WORKERS

__all__ = ["COUNT_END", "STATS", "TALLY", "WORKERS", "Tally", "beat", "field", "read_counters"]

SEP = "|"
WORKER_FORGET_SECONDS = 3600.0
"""A worker silent this long leaves `WORKERS` (pruned by the beats of the others): a dead
worker's series should end, not stay in every scrape forever."""

# A Lua function for scripts that end a job: `count_end(stats key, job key, status)` counts it
# in `ended|queue|status|code`, after the script has written the job's error code (if any).
COUNT_END = """
local function count_end(stats, job, status)
  local q = redis.call('HGET', job, 'queue') or 'cpu'
  local code = redis.call('HGET', job, 'error_code') or ''
  if status ~= 'failed' then code = '' end
  redis.call('HINCRBY', stats, 'ended|' .. q .. '|' .. status .. '|' .. code, 1)
end
"""


def field(name: str, *labels: str) -> str:
    return SEP.join((name, *labels))


class Tally:
    """Increments this process has counted and not yet written to `STATS`; thread-safe."""

    def __init__(self) -> None:
        self._pending: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, *labels: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._pending[field(name, *labels)] += n

    def pending(self) -> dict[str, int]:
        with self._lock:
            return dict(self._pending)

    def flush(self, client: redis.Redis) -> None:
        """Write the pending increments; raises RedisError, keeping them for the next flush."""
        with self._lock:
            taken, self._pending = self._pending, Counter()
        if not taken:
            return
        try:
            pipe = client.pipeline(transaction=False)
            for name, n in taken.items():
                pipe.hincrby(STATS, name, n)
            pipe.execute()
        except BaseException:
            with self._lock:
                self._pending.update(taken)
            raise


TALLY = Tally()
"""The process's tally: every counting site adds here, and the process's flusher writes it."""


def beat(client: redis.Redis, node: str, now: float | None = None) -> None:
    """Stamp `node` as alive now, forget long-silent workers, and flush this process's tally.
    One round trip; raises RedisError (the caller's next pass tries again)."""
    now = time.time() if now is None else now
    pipe = client.pipeline(transaction=False)
    pipe.zadd(WORKERS, {node: now})
    pipe.zremrangebyscore(WORKERS, "-inf", now - WORKER_FORGET_SECONDS)
    pipe.execute()
    TALLY.flush(client)


def read_counters(client: redis.Redis) -> dict[str, int]:
    """The counters (for tests and tools; the API reads them itself, asynchronously)."""
    raw = cast(dict[str, str], client.hgetall(STATS))
    return {name: int(value) for name, value in raw.items()}
