"""Riding out a Redis stall, restart or failover: deliberate timeouts and bounded retries.

An fsync pause, a failover or a restart makes Redis unanswerable for seconds, and redis-py's
defaults (5 s socket timeout, no retry) turn that into an exception in whatever called the store,
which for a worker used to mean a failed job (docs/developers/design.md#redis-outages). A store
error is not the job's fault: the workers retry every store call here, with exponential backoff, and
give up only when Redis has been unreachable for a whole configured outage
(`PDPPO_STORE_OUTAGE_SECONDS`), raising `StoreUnavailable` so that the caller hands the job back
instead of failing it.

Only transient errors are retried (`is_transient`): a lost or refused connection, a timeout, Redis
still loading its append-only file after a restart, a replica that is read-only during a failover.
Anything else (a script error, a wrong type, `OOM command not allowed`) is a bug or an operator's
problem that waiting does not fix, and is raised at once.

A retry after a timeout is ambiguous: the command may have run, only its reply was lost, and it
may even run later (it waits in the abandoned connection's buffer while Redis sleeps). So only
idempotent writes are retried as they are (publishing step N twice publishes it once; renewing a
lease twice renews it); a log line goes through a script that adds it only if it is not among
the stream's latest entries (`add_event_once`), and a write that cannot be made idempotent passes
`recover`, asked before every retry that follows a failure whether the write already happened.

Retrying lives here, where it knows which call is idempotent, not in redis-py's connection
`Retry`, which would re-send any command (an `XADD` twice) behind the caller's back: clients made
by `store_client` retry nothing themselves.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ReadOnlyError, TryAgainError
from redis.retry import Retry

from pdppo.store.jobs.events import log_data
from pdppo.store.keys import events_key

if TYPE_CHECKING:
    from pdppo.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# BusyLoadingError (Redis reading its AOF after a restart) is a ConnectionError already.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ReadOnlyError,
    TryAgainError,
)
# How far back in a job's event stream a log line is looked for before it is added again: a
# retried copy runs moments after the first, with at most a few entries from others between.
LOG_RECOVERY_WINDOW = 200


def is_transient(exc: BaseException) -> bool:
    """True for errors that Redis coming back cures: worth retrying."""
    return isinstance(exc, TRANSIENT_ERRORS)


class StoreUnavailable(redis.RedisError):
    """Redis stayed unreachable for longer than the configured outage (or the attempts ran out).

    A `RedisError`, so code that already copes with store errors copes with this one; callers
    that run a job hand it back (checkpoint, requeue) instead of failing it."""

    def __init__(self, what: str, waited: float, attempts: int, cause: BaseException) -> None:
        self.what = what
        self.waited = waited
        self.attempts = attempts
        self.cause = cause
        super().__init__(
            f"Redis unreachable for {waited:.1f}s ({attempts} attempts) while trying to {what}: "
            f"{type(cause).__name__}: {cause}"
        )


@dataclass(frozen=True)
class StoreConfig:
    """How a worker or job process talks to Redis; plain values, so it pickles to a job process.

    `socket_timeout`: the longest wait for one reply. No worker command blocks on the server (no
    `XREAD BLOCK`, no `BLPOP`), so a reply slower than this means Redis is stalled; a pause of a
    few seconds (an fsync) rides through without even a retry, a longer one surfaces as a
    `TimeoutError` and is retried. `connect_timeout` is shorter: a connect either completes in
    milliseconds or the host is gone. `health_check_interval` pings a connection idle that long
    before reusing it, so one left half-open by a restart fails fast instead of timing out.
    `outage_seconds`: how long to keep retrying one call before `StoreUnavailable`."""

    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    health_check_interval: int = 30
    outage_seconds: float = 60.0

    @classmethod
    def from_settings(cls, settings: Settings) -> StoreConfig:
        return cls(
            socket_timeout=settings.redis_socket_timeout_seconds,
            connect_timeout=settings.redis_connect_timeout_seconds,
            outage_seconds=settings.store_outage_seconds,
        )


def store_client(url: str, config: StoreConfig) -> redis.Redis:
    """A synchronous client (decode_responses=True) with the timeouts above and no retries of
    its own (`StoreRetry` decides what may be sent twice)."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=config.socket_timeout,
        socket_connect_timeout=config.connect_timeout,
        socket_keepalive=True,
        health_check_interval=config.health_check_interval,
        retry=Retry(NoBackoff(), 0),
    )


class StoreRetry:
    """Calls the store until it answers: exponential backoff with jitter from `base` up to `cap`
    seconds between attempts, for at most `outage_seconds` from the first failure (and at most
    `max_attempts` calls, when set). Thread-safe: it holds no state between calls."""

    def __init__(
        self,
        outage_seconds: float,
        *,
        base: float = 0.05,
        cap: float = 2.0,
        max_attempts: int | None = None,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.outage_seconds = outage_seconds
        self.base = base
        self.cap = cap
        self.max_attempts = max_attempts
        self._sleep = sleep

    @classmethod
    def from_config(cls, config: StoreConfig) -> StoreRetry:
        return cls(config.outage_seconds)

    def delay(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failure in a row: half fixed, half random, so
        many workers coming back at once do not hit a recovering Redis in lockstep."""
        ceiling = min(self.cap, self.base * 2 ** min(failures - 1, 30))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def call(
        self,
        what: str,
        fn: Callable[[], T],
        *,
        recover: Callable[[], T | None] | None = None,
        before_retry: Callable[[], None] | None = None,
    ) -> T:
        """`fn()`, retried through transient errors; raises `StoreUnavailable` past the bound.

        `recover`: for a write that must not happen twice, asked before each retry that follows
        a failure: the result if the failed attempt did land after all, else None (run `fn`
        again). `before_retry`: called before each wait; it may raise to abandon the call (a
        lost lease: not one more write)."""
        failures = 0
        since = 0.0
        while True:
            started = time.monotonic()
            try:
                if failures and recover is not None:
                    landed = recover()
                    if landed is not None:
                        self._back(what, failures, since)
                        return landed
                result = fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                failures += 1
                if failures == 1:
                    since = started
                waited = time.monotonic() - since
                out_of_attempts = self.max_attempts is not None and failures >= self.max_attempts
                if waited >= self.outage_seconds or out_of_attempts:
                    log.error("giving up on Redis after %.1fs: could not %s", waited, what)
                    raise StoreUnavailable(what, waited, failures, exc) from exc
                if failures == 1:
                    log.warning(
                        "Redis unreachable (%s: %s) while trying to %s; retrying for up to %.0fs",
                        type(exc).__name__,
                        exc,
                        what,
                        self.outage_seconds,
                    )
                if before_retry is not None:
                    before_retry()
                self._sleep(self.delay(failures))
                continue
            self._back(what, failures, since)
            return result

    @staticmethod
    def _back(what: str, failures: int, since: float) -> None:
        if failures:
            log.warning(
                "Redis answered again after %.1fs (%d failed attempts) to %s",
                time.monotonic() - since,
                failures,
                what,
            )


def log_fields(message: str) -> dict[str, str]:
    """A `log` entry of a job's event stream, stamped now: build it when the line is written, not
    when a stalled Redis finally takes it."""
    return {"type": "log", "data": log_data(message)}


# KEYS: events; ARGV: type, data, how many recent entries to look through. An entry already
# there (same type, same data: the data carries its own `at` timestamp) is not added again.
ADD_ONCE = """
local recent = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[3])
for _, entry in ipairs(recent) do
  local f = entry[2]
  if f[1] == 'type' and f[2] == ARGV[1] and f[3] == 'data' and f[4] == ARGV[2] then
    return 0
  end
end
redis.call('XADD', KEYS[1], '*', 'type', ARGV[1], 'data', ARGV[2])
return 1
"""


def add_event_once(
    client: redis.Redis,
    retry: StoreRetry,
    job_id: str,
    fields: dict[str, str],
    *,
    before_retry: Callable[[], None] | None = None,
) -> bool:
    """Append `fields` (type, data) to the job's event stream exactly once, through a Redis stall;
    False if it was there already.

    A plain `XADD` is not idempotent, and one that timed out may still run after Redis wakes
    (it sits in the abandoned connection's buffer), so checking for it before sending it again
    cannot be exact. This script checks and appends in one step, so every copy after the first,
    whenever it runs, finds the entry among the stream's latest and adds nothing."""
    add = client.register_script(ADD_ONCE)
    keys = [events_key(job_id)]
    args: list[str | int] = [fields["type"], fields["data"], LOG_RECOVERY_WINDOW]
    what = f"add a {fields['type']} event to job {job_id}"
    return bool(retry.call(what, lambda: add(keys=keys, args=args), before_retry=before_retry))


def publish_log_once(
    client: redis.Redis,
    retry: StoreRetry,
    job_id: str,
    message: str,
    *,
    before_retry: Callable[[], None] | None = None,
) -> None:
    """`EventStore.publish_log`, exactly once through a Redis stall (see `add_event_once`)."""
    add_event_once(client, retry, job_id, log_fields(message), before_retry=before_retry)
