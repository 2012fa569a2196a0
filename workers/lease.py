"""A job's lease in Redis: who may run it now (DESIGN §3, Celery redelivers unacked tasks).

The holder renews it from a heartbeat thread every third of its lifetime. A worker killed with -9
stops renewing, the lease expires, and a reaper (`workers.reaper`) queues the job again to resume
from its last checkpoint. A holder that fails to renew (it was too slow, and someone else may now
hold the job) learns it through `lost` and must stop without writing anything.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import redis

from pdppo.store import lease_key

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


class LeaseLost(RuntimeError):
    """The lease expired or was taken while this worker still ran the job."""


class Lease:
    def __init__(self, client: redis.Redis, job_id: str, seconds: float, owner: str) -> None:
        self.redis = client
        self.key = lease_key(job_id)
        self.ttl_ms = int(seconds * 1000)
        self.token = f"{owner}:{secrets.token_hex(8)}"
        self.lost = threading.Event()
        self._renewed_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def acquire(self) -> bool:
        self._renewed_at = time.monotonic()
        return bool(self.redis.set(self.key, self.token, nx=True, px=self.ttl_ms))

    def renew(self) -> bool:
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
        if time.monotonic() - self._renewed_at >= self.ttl_ms / 1000:
            self.lost.set()
        if self.lost.is_set():
            raise LeaseLost(f"lease {self.key} was lost; another worker may run the job")

    def _beat(self) -> None:
        interval = self.ttl_ms / 3000
        while not self._stop.wait(interval):
            try:
                if not self.renew():
                    self.lost.set()
                    return
            except redis.RedisError:
                log.warning("lease renewal of %s failed; retrying", self.key, exc_info=True)
