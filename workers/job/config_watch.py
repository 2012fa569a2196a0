"""The job process's view of its job's steering changes (`PATCH /v1/jobs/{id}`).

The trainer asks for the newest change at every step boundary and must never wait on Redis for
it (docs/developers/design.md#redis-outages), so a thread reads the job's `config_version` and
`overrides` every POLL_SECONDS and keeps the newest in memory; a failed read is tried again at the
next poll.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from pdppo.store.jobs.steering import Steering

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5


class ConfigWatch:
    def __init__(self, steering: Steering, job_id: str) -> None:
        self.steering = steering
        self.job_id = job_id
        self._latest: tuple[int, dict[str, Any]] = (0, {})  # version 0: no change yet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="pdppo config", daemon=True)

    def start(self) -> None:
        self._read()  # a change made while the job was queued applies from its first step
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """(version, the cumulative overrides of `train`), or None before any change."""
        with self._lock:
            version, overrides = self._latest
        return (version, overrides) if version > 0 else None

    def _poll(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._read()

    def _read(self) -> None:
        try:
            version, overrides = self.steering.config(self.job_id)
        except redis.RedisError as exc:
            log.debug("could not read job %s's config (%s); retrying", self.job_id, exc)
            return
        train = overrides.get("train", {})
        with self._lock:
            if version > self._latest[0]:
                self._latest = (version, train if isinstance(train, dict) else {})
