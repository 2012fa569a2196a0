"""A job's lease in Redis: who may run it now (DESIGN §3, Celery redelivers unacked tasks).

The holder renews it from a heartbeat thread six times per lifetime. A worker killed with -9 stops
renewing, the lease expires, and a reaper (`workers.reaper`) queues the job again to resume from
its last checkpoint. A holder that fails to renew (it was too slow, and someone else may now hold
the job) learns it through `lost` and must stop without writing anything.

Redis stalls: a renewal that fails is retried with a short backoff (at most a second), not a
whole interval later. So a stall shorter than five sixths of the lease less that second (24 s of
the default 30 s) never loses it, whenever it starts; no more can be promised, since a stall may
begin just before a renewal was due. A stall longer than the lease does lose it: the key expires
in Redis, and the holder, which cannot know whether another worker took the job meanwhile, must
give it up. `LeaseLost` then says whether Redis was unreachable (`unreachable`), so that the job
is handed back with that reason rather than counted as a lost worker.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import redis

from pdppo.store import StoreRetry, lease_key

log = logging.getLogger(__name__)

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
RENEWALS_PER_LEASE = 6


class LeaseLost(RuntimeError):
    """The lease expired or was taken while this worker still ran the job.

    `unreachable`: it expired because Redis did not answer the renewals (a stall, a restart),
    not because another holder took it or this process stopped renewing."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class Lease:
    def __init__(
        self,
        client: redis.Redis,
        job_id: str,
        seconds: float,
        owner: str,
        retry: StoreRetry | None = None,
    ) -> None:
        self.redis = client
        self.key = lease_key(job_id)
        self.ttl_ms = int(seconds * 1000)
        self.token = f"{owner}:{secrets.token_hex(8)}"
        self.lost = threading.Event()
        self.lost_reason = ""
        self.unreachable = False  # lost because Redis did not answer (see LeaseLost)
        # acquire() is retried no longer than the lease itself: past that, give the task up.
        self.retry = retry or StoreRetry(seconds)
        self._renewed_at = time.monotonic()
        self._failing_since: float | None = None  # first failed renewal since the last success
        self._renewing_since: float | None = None  # a renewal waiting for its reply
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @property
    def seconds(self) -> float:
        return self.ttl_ms / 1000

    def acquire(self) -> bool:
        """Take the lease if nobody holds it. Retried through a stall: a `SET NX` whose reply was
        lost (or that ran late, from an abandoned connection) may have taken it already, so a
        key that holds this lease's own token counts as taken."""
        self._renewed_at = time.monotonic()

        def take() -> bool:
            started = time.monotonic()
            if self.redis.set(self.key, self.token, nx=True, px=self.ttl_ms):
                self._renewed_at = started
                return True
            return bool(self.redis.get(self.key) == self.token)

        return self.retry.call(f"acquire {self.key}", take)

    def renew(self) -> bool:
        """One renewal (idempotent, so a retry after a lost reply is safe); raises RedisError."""
        started = time.monotonic()
        ok = bool(self._renew(keys=[self.key], args=[self.token, self.ttl_ms]))
        if ok:
            self._renewed_at = started
        return ok

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def release(self) -> None:
        self.stop_heartbeat()
        try:
            self._release(keys=[self.key], args=[self.token])
        except redis.RedisError:
            log.warning("could not release %s; it expires by itself", self.key, exc_info=True)

    def start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name=f"lease {self.key}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise if the lease is gone, or may be: not renewed for a whole lifetime (Redis was
        unreachable), in which case it expired and a reaper may have handed the job on."""
        silent = time.monotonic() - self._renewed_at
        if not self.lost.is_set() and silent >= self.seconds:
            self._lose(f"not renewed for {silent:.0f}s", unreachable=self._redis_silent())
        if self.lost.is_set():
            raise LeaseLost(
                f"lease {self.key} was lost ({self.lost_reason}); another worker may run the job",
                unreachable=self.unreachable,
            )

    def _redis_silent(self) -> bool:
        """Whether Redis, rather than this process, is why no renewal succeeded: renewals failed,
        or one has been waiting for its reply."""
        return self._failing_since is not None or self._renewing_since is not None

    def _lose(self, reason: str, *, unreachable: bool) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.unreachable = unreachable
        self.lost.set()
        log.warning("lease %s lost: %s", self.key, reason)

    def _beat(self) -> None:
        interval = self.seconds / RENEWALS_PER_LEASE
        backoff = StoreRetry(float("inf"), base=0.05, cap=min(1.0, interval))
        failures = 0
        wait = interval
        while not self._stop.wait(wait):
            self._renewing_since = time.monotonic()
            try:
                ok = self.renew()
            except redis.RedisError as exc:
                failures += 1
                if self._failing_since is None:
                    self._failing_since = self._renewing_since
                    log.warning("lease renewal of %s failed (%s); retrying", self.key, exc)
                wait = backoff.delay(failures)
                continue
            finally:
                self._renewing_since = None
            if not ok:
                silent = time.monotonic() - self._renewed_at
                if silent >= self.seconds:
                    # Expired in Redis while the renewals went unanswered.
                    self._lose(f"expired after {silent:.0f}s without a renewal", unreachable=True)
                else:
                    self._lose("taken over or deleted", unreachable=False)
                return
            if self._failing_since is not None:
                log.warning(
                    "lease %s renewed again after %.1fs of failures",
                    self.key,
                    time.monotonic() - self._failing_since,
                )
            failures = 0
            self._failing_since = None
            wait = interval
