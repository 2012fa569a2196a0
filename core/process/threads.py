"""How many torch threads each training process gets: its share of the cores it may run on.

torch's default is a thread per core in every process, whatever else runs there. On a worker
running two jobs at once, or a job of two ranks, every core then has several busy threads, and
torch's threads spin while they wait for each other: on a loaded 2-core machine the smoke job's
steps took 38-51 s with the default and 1.6-3.8 s with one thread, and two ranks were slower
than one (issue 37). So the cores this process may use (its CPU affinity: a container's cpuset
or a `taskset`, not the machine's count) are split between the jobs that run on them at once and
then between each job's processes, at least one thread each. A worker counts those jobs itself,
across every worker on its host (`workers.job.cores`), unless its operator says how many.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def own_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def asked_threads(value: int | None, setting: str) -> tuple[int | None, str]:
    """The thread count someone chose and where: `value` of `setting` when set, else
    OMP_NUM_THREADS (torch's own default follows it, so a process started with it keeps it),
    else (None, "")."""
    if value:
        return value, setting
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) >= 1:
        return int(raw), "OMP_NUM_THREADS"
    return None, ""


@dataclass(frozen=True)
class ThreadShare:
    threads: int  # torch threads of each process
    cores: int
    jobs: int | None  # jobs that run at once on these cores (a worker's); None: a local run
    ranks: int  # processes of one job
    setting: str | None = None  # the setting that chose `threads`, when one did
    counted: bool = False  # `jobs` are the jobs counted running on the host, not a setting

    def describe(self) -> str:
        """The job's log line that says what it was given and why."""
        if self.setting is not None:
            return f"torch threads: {self.threads} per process ({self.setting})"
        why = [f"{self.cores} core{'s' * (self.cores != 1)}"]
        if self.jobs is not None:
            where = "running on this host" if self.counted else "at once"
            why.append(f"{self.jobs} job{'s' * (self.jobs != 1)} {where}")
        if self.ranks != 1:
            why.append(f"{self.ranks} processes")
        return f"torch threads: {self.threads} per process ({', '.join(why)})"


def share_cores(
    cores: int,
    jobs: int | None = None,
    ranks: int = 1,
    asked: int | None = None,
    setting: str = "PDPPO_JOB_THREADS",
    counted: bool = False,
) -> ThreadShare:
    """`asked` (an operator's `setting`) when given, else `cores` split between `jobs` (a
    worker's, `counted` on its host or set by its operator; None for a local run: 1) and then
    between each job's `ranks` (rounded down, at least 1)."""
    if asked:
        return ThreadShare(asked, cores, jobs, ranks, setting)
    per_job = cores // max(1, jobs or 1)
    return ThreadShare(max(1, per_job // max(1, ranks)), cores, jobs, ranks, counted=counted)
