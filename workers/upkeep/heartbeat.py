"""A worker's proof of life for its container's healthcheck: a file that the reaper thread
rewrites whenever it has just reached Redis.

Celery's own `inspect ping` travels through the broker and is answered by the worker's main
thread, which sits inside the running job (`-P solo`) for hours: a healthcheck built on it would
call every busy worker dead. The reaper thread runs beside the job and talks to Redis every
second or so, so a recent write says both "this process lives" and "it can reach the store".

One file per worker process, named after its Celery node. A restarted container keeps its /tmp,
and with it the files of processes that are gone: those are skipped (their pid no longer runs),
so `pdppo healthcheck` answers for the workers that run now.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from pdppo.store import stats

log = logging.getLogger(__name__)

# Seconds between two writes of one worker's file: the reaper reaches Redis every second or so,
# and a healthcheck that polls every 15 s needs no finer grain.
WRITE_EVERY_SECONDS = 5.0


def _file_name(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@-]", "_", node) or "worker"


class Heartbeat:
    """Writes `<folder>/<node>` at most every `every` seconds; `beat()` is cheap to call often.

    With `client`, each beat also stamps the worker in Redis and flushes its counters
    (`pdppo.store.stats.beat`): the API's `/metrics` counts workers alive from there, since it
    cannot read files on the workers' disks."""

    def __init__(
        self,
        folder: Path,
        node: str,
        every: float = WRITE_EVERY_SECONDS,
        client: redis.Redis | None = None,
    ) -> None:
        self.path = folder / _file_name(node)
        self.node = node
        self.every = every
        self.client = client
        self._last = float("-inf")

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "at": time.time()}))
        os.replace(tmp, self.path)  # a reader never sees half a file
        self._last = now
        if self.client is not None:
            try:
                stats.beat(self.client, self.node)
            except redis.RedisError as exc:  # the next beat tries again
                log.warning("could not record this worker's beat in Redis: %s", exc)


@dataclass(frozen=True)
class Beat:
    node: str
    pid: int
    age: float  # seconds since the worker last reached Redis


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it runs
        return True
    return True


def read_beats(folder: Path, now: float | None = None) -> list[Beat]:
    """The beats of the worker processes that still run, oldest first."""
    now = time.time() if now is None else now
    beats = []
    for path in sorted(folder.glob("[!.]*")):
        try:
            data = json.loads(path.read_text())
            pid, at = int(data["pid"]), float(data["at"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # removed while listed, or not ours
        if _running(pid):
            beats.append(Beat(path.name, pid, now - at))
    return sorted(beats, key=lambda b: -b.age)


def node_beat(folder: Path, node: str, now: float | None = None) -> Beat | None:
    """The beat of the running process named `node`, if it has beaten (one container's own
    node, where several kinds of worker share a folder)."""
    name = _file_name(node)
    return next((beat for beat in read_beats(folder, now) if beat.node == name), None)


def verdict(beats: list[Beat], max_age: float) -> tuple[bool, str]:
    """Healthy when at least one worker runs and every running one reached Redis within
    `max_age` seconds; the message says which one is late, for `docker inspect`."""
    if not beats:
        return False, "no worker process has reached Redis yet"
    late = [b for b in beats if b.age > max_age]
    if late:
        named = ", ".join(f"{b.node} ({b.age:.0f}s ago)" for b in late)
        return False, f"last reached Redis more than {max_age:.0f}s ago: {named}"
    newest = min(b.age for b in beats)
    return True, f"{len(beats)} worker process(es) alive; Redis reached {newest:.0f}s ago"
