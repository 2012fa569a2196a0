"""How many jobs run on this host's cores now, so that each job's torch threads are its share.

torch's default, a thread per core in every process, makes jobs that share cores run 10-30x
slower (docs/developers/design.md#jobs-in-a-process-of-their-own).
`PDPPO_WORKER_JOBS_AT_ONCE` splits a worker's cores between the jobs it runs, but several
workers on one machine (one per GPU, a second `pdppo worker`, `pdppo dev` beside compose) know
nothing of each other, and each took every core. So each job process enters
itself in its host's set of running jobs in Redis (job id, scored by when the entry lapses
unless renewed), counts the live entries, and takes `cores // jobs // ranks` threads, at least
one (`core.process.threads`). A thread renews the entry and counts again every few seconds; a
change is applied at the next step boundary, on the training thread (under OpenMP torch's
thread count belongs to the thread that sets it), in every rank of the job. So the jobs already
running give cores up when another starts, and take them back when it ends.

A host is what shares cores: the kernel's boot id (the same in every container on a machine)
and the CPUs this process may run on (its affinity: containers pinned to disjoint cpusets do not
share). An entry whose job process died without a word lapses after ENTRY_SECONDS; its worker
removes it at once (`leave`). With `PDPPO_WORKER_JOBS_AT_ONCE` or `PDPPO_JOB_THREADS` set, the
operator's number is used instead, and the job still counts for the others.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import cast

import redis

from core.process.threads import ThreadShare
from pdppo.store.keys import host_jobs_key

log = logging.getLogger(__name__)

ENTRY_SECONDS = 15.0  # a job's entry lapses this long after its last renewal
RECOUNT_SECONDS = 2.0  # how often a job renews its entry and counts the others again

# KEYS: the host's jobs; ARGV: job id, now, its entry's end (0: leave). Drops lapsed entries,
# renews (or removes) this job's, and counts the jobs running on the host.
_ENTER = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if tonumber(ARGV[3]) > 0 then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('PEXPIREAT', KEYS[1], math.floor(tonumber(ARGV[3]) * 1000) + 1000)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZCARD', KEYS[1])
"""


def host_id() -> str:
    """This host's cores: the boot id and a digest of the CPUs this process may run on."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = list(range(os.cpu_count() or 1))
    return f"{boot}:{hashlib.sha256(repr(cpus).encode()).hexdigest()[:12]}"


def count_jobs(client: redis.Redis, job_id: str, lapse_at: float, now: float | None = None) -> int:
    """Enter `job_id` until `lapse_at` (0: take it out) and count the host's running jobs."""
    now = time.time() if now is None else now
    script = client.register_script(_ENTER)
    return int(cast(int, script(keys=[host_jobs_key(host_id())], args=[job_id, now, lapse_at])))


def leave(client: redis.Redis, job_id: str) -> None:
    """The job no longer runs here: its cores are the others' now (best effort: else it lapses)."""
    try:
        count_jobs(client, job_id, 0)
    except redis.RedisError as exc:
        log.warning("could not take job %s out of the host's running jobs: %s", job_id, exc)


class CoreShare:
    """A job process's share of its host's cores, kept up to date by a thread.

    `share_of(jobs)` makes the share for a count of running jobs (the operator's settings,
    the cores, the job's ranks). `threads` is a shared integer that the job's other ranks read
    too (`workers.job.ranks`); `apply` sets it on the calling (training) thread."""

    def __init__(
        self,
        client: redis.Redis,
        job_id: str,
        share_of: Callable[[int], ThreadShare],
        every: float = RECOUNT_SECONDS,
    ) -> None:
        import multiprocessing

        self.client = client
        self.job_id = job_id
        self.share_of = share_of
        self.every = every
        self.share = share_of(1)
        self.threads: Synchronized[int] = cast(
            "Synchronized[int]", multiprocessing.get_context("spawn").Value("i", self.share.threads)
        )
        self._applied = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pdppo cores", daemon=True)

    def start(self) -> ThreadShare:
        """Enter the job, count once, and go on counting; returns the first share."""
        self._count()
        self._thread.start()
        return self.share

    def stop(self) -> None:
        self._stop.set()
        leave(self.client, self.job_id)

    def apply(self) -> ThreadShare | None:
        """Set this thread's torch threads to the current share; the share when it changed."""
        import torch

        share = self.share
        if share.threads == self._applied:
            return None
        torch.set_num_threads(share.threads)
        self._applied = share.threads
        return share

    def _count(self) -> None:
        try:
            jobs = count_jobs(self.client, self.job_id, time.time() + ENTRY_SECONDS)
        except redis.RedisError as exc:  # keep the last count; the next round tries again
            log.warning("could not count the jobs running on this host: %s", exc)
            return
        share = self.share_of(max(1, jobs))
        self.share = share
        self.threads.value = share.threads

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            self._count()


def follow_share(threads: Synchronized[int]) -> None:
    """A rank's side of `CoreShare.apply`: its torch threads to the shared count (at a step
    boundary, on its training thread)."""
    import torch

    wanted = threads.value
    if wanted != torch.get_num_threads():
        torch.set_num_threads(wanted)
