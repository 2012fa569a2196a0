"""A job's lease in Redis: who may run it now (Celery redelivers unacked tasks).

The holder renews it from a heartbeat thread six times per lifetime
(docs/developers/design.md#the-lease). A worker killed with -9 stops
renewing, the lease expires, and a reaper (`workers.upkeep.reaper`) queues the job again to resume
from its last checkpoint. A holder that fails to renew (it was too slow, and someone else may now
hold the job) learns it through `lost` and must stop without writing anything.

Redis stalls: a renewal that fails is retried with a short backoff (at most a second), not a
whole interval later. So a stall shorter than five sixths of the lease less that second (24 s of
the default 30 s) never loses it, whenever it starts; no more can be promised, since a stall may
begin just before a renewal was due. A stall longer than the lease does lose it: the key expires
in Redis, and the holder, which cannot know whether another worker took the job meanwhile, must
give it up. `LeaseLost` then says whether Redis was unreachable (`unreachable`), so that the job
is handed back with that reason rather than counted as a lost worker.

The job process is fenced by the same lease (issue 12). It runs in a session of its own, so a worker
frozen past its lease (SIGSTOP of its process group, a VM pause, a swap stall) leaves it training
while a second worker resumes the job. Two things stop it: every write it makes to the store passes
its claim's token, the lease token, which the store's scripts refuse once the lease is no longer
that token (`pdppo.store.jobs.worker_side.FencedOut`); and `LeaseFence` watches the lease from the
job process itself, so it stops within moments of the lease lapsing, and refuses to let a checkpoint
be written unless the lease is sure to outlast it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import redis

from pdppo.store import StoreRetry, lease_key
from pdppo.store.jobs.clock import STORE_TICK, gap_and_hold_ms
from pdppo.store.keys import STALL_SEEN, STORE_CLOCK
from pdppo.store.stats import TALLY

log = logging.getLogger(__name__)

# KEYS: lease, the store's clock, its stall key; ARGV: token, ttl ms, stall gap ms, hold ms. Each
# renewal also stamps the store's clock (`pdppo.store.jobs.clock`), so a stall is seen by whoever
# comes first after it, even when no reaper passed during it.
_RENEW = (
    STORE_TICK
    + """
store_tick(KEYS[2], KEYS[3], ARGV[3], ARGV[4])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
)
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
RENEWALS_PER_LEASE = 6
# A checkpoint starts only while the lease is sure to last this part of its lifetime longer: the
# write must end before the lease could pass to another worker that resumes from the folder.
CHECKPOINT_SHARE = 0.5


class LeaseLost(RuntimeError):
    """The lease expired or was taken while this worker still ran the job.

    `unreachable`: it expired because Redis did not answer the renewals (a stall, a restart),
    not because another holder took it or this process stopped renewing. No default: the worker
    hands a job back only when Redis was to blame, so each raise must say which it was."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
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
        gap, hold = gap_and_hold_ms(self.seconds)
        keys = [self.key, STORE_CLOCK, STALL_SEEN]
        ok = bool(self._renew(keys=keys, args=[self.token, self.ttl_ms, gap, hold]))
        if ok:
            self._renewed_at = started
            TALLY.add("lease_renewals")
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
        TALLY.add("lease_losses", "unreachable" if unreachable else "taken")
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


class LeaseFence:
    """The job process's own view of its claim's lease: the lease key must still hold `token`.

    A thread reads the key and its remaining lifetime (one round trip, MULTI of GET and PTTL) at
    the heartbeat's own cadence, and sets `lost` as soon as the key names someone else or nobody
    (expired: a frozen worker stopped renewing it, and a reaper may hand the job on). From each
    reply it also knows a time until which nobody else can hold the lease (`held_until`: the
    request's send time plus the TTL; only the holder deletes the key early). `ensure_held` is
    the gate before a checkpoint: in memory while that time is far enough ahead (always, while
    the worker renews), else it asks Redis, waits for a late renewal, and raises `LeaseLost`
    once the lease has lapsed or is too short to outlast a checkpoint write. So the training
    thread waits on Redis only when its lease is in doubt."""

    def __init__(self, client: redis.Redis, job_id: str, token: str, seconds: float) -> None:
        self.redis = client
        self.job_id = job_id
        self.key = lease_key(job_id)
        self.token = token
        self.seconds = seconds
        self.margin = seconds * CHECKPOINT_SHARE
        self.lost = threading.Event()
        self.reason = ""
        self.unreachable = False
        self._held_until = time.monotonic()  # unknown yet: the first gate asks Redis
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held_for(self) -> float:
        """Seconds the lease is known to stay this claim's (negative: it may have passed)."""
        return self._held_until - time.monotonic()

    def check(self) -> bool:
        """Ask Redis once; True while the key holds the token. Raises RedisError."""
        sent = time.monotonic()
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(self.key)
        pipe.pttl(self.key)
        owner, ttl_ms = pipe.execute()
        if owner != self.token:
            self.lose("taken over" if owner else "expired or released", unreachable=False)
            return False
        with self._lock:
            self._held_until = max(self._held_until, sent + max(int(ttl_ms), 0) / 1000)
        return True

    def lose(self, reason: str, *, unreachable: bool) -> None:
        with self._lock:
            if self.lost.is_set():
                return
            self.reason, self.unreachable = reason, unreachable
            self.lost.set()
        log.warning(
            "lease %s no longer this job's (%s): stopping, not one more write", self.key, reason
        )

    def raise_if_lost(self) -> None:
        if self.lost.is_set():
            raise LeaseLost(
                f"lease {self.key} was lost ({self.reason}); another worker may run the job",
                unreachable=self.unreachable,
            )

    def ensure_held(self) -> None:
        """Return once the lease is sure to stay this claim's for `margin` seconds more; raise
        `LeaseLost` when it has passed (or may have: Redis silent past `held_until`)."""
        while True:
            self.raise_if_lost()
            if self.held_for >= self.margin:
                return
            try:
                self.check()
            except redis.RedisError as exc:
                if self.held_for <= 0:
                    self.lose(f"could not be read past its expiry ({exc})", unreachable=True)
            self.raise_if_lost()
            if self.held_for >= self.margin:
                return
            if self.held_for <= 0:
                self.lose("expired without a renewal", unreachable=False)
                continue
            time.sleep(min(0.1, self.seconds / 20))  # a renewal is late: wait for it

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name=f"fence {self.key}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # not joined: a read stuck on a stalled Redis ends with its timeout

    def _watch(self) -> None:
        interval = self.seconds / RENEWALS_PER_LEASE
        while not self.lost.is_set() and not self._stop.wait(interval):
            try:
                self.check()
            except redis.RedisError as exc:
                if self.held_for <= 0:
                    self.lose(f"could not be read past its expiry ({exc})", unreachable=True)
