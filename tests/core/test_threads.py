"""The torch threads each training process gets (`core.process.threads`): a table of cores, jobs at
once, ranks and settings, with the log line the job shows."""

from __future__ import annotations

import os

import pytest

from core.process.threads import asked_threads, own_cores, share_cores


@pytest.mark.parametrize(
    ("cores", "jobs", "ranks", "asked", "threads", "line"),
    [
        (4, 2, 1, None, 2, "torch threads: 2 per process (4 cores, 2 jobs at once)"),
        (4, 1, 1, None, 4, "torch threads: 4 per process (4 cores, 1 job at once)"),
        (4, 1, 2, None, 2, "torch threads: 2 per process (4 cores, 1 job at once, 2 processes)"),
        (8, 2, 2, None, 2, "torch threads: 2 per process (8 cores, 2 jobs at once, 2 processes)"),
        # rounded down, never below one
        (7, 2, 1, None, 3, "torch threads: 3 per process (7 cores, 2 jobs at once)"),
        (2, 4, 1, None, 1, "torch threads: 1 per process (2 cores, 4 jobs at once)"),
        (1, 1, 4, None, 1, "torch threads: 1 per process (1 core, 1 job at once, 4 processes)"),
        # the operator's setting wins whatever the cores
        (4, 2, 2, 3, 3, "torch threads: 3 per process (PDPPO_JOB_THREADS)"),
        # the jobs a worker counted running on its host (`workers.job.cores`)
        (4, 2, 1, None, 2, "torch threads: 2 per process (4 cores, 2 jobs running on this host)"),
        (4, 1, 1, None, 4, "torch threads: 4 per process (4 cores, 1 job running on this host)"),
        (
            *(2, 3, 2, None, 1),
            "torch threads: 1 per process (2 cores, 3 jobs running on this host, 2 processes)",
        ),
        # a local run (`pdppo train --nproc N`): no worker, no jobs at once
        (4, None, 2, None, 2, "torch threads: 2 per process (4 cores, 2 processes)"),
        (4, None, 1, None, 4, "torch threads: 4 per process (4 cores)"),
    ],
)
def test_share_cores(
    cores: int, jobs: int | None, ranks: int, asked: int | None, threads: int, line: str
) -> None:
    share = share_cores(cores, jobs, ranks, asked, counted="running on this host" in line)
    assert share.threads == threads
    assert share.describe() == line


@pytest.mark.parametrize(
    ("value", "omp", "expected"),
    [
        (3, "2", (3, "PDPPO_JOB_THREADS")),  # the setting first
        (None, "2", (2, "OMP_NUM_THREADS")),
        (None, None, (None, "")),
        (None, "", (None, "")),
        (None, "0", (None, "")),  # not a thread count: ignored, as torch does
        (None, "two", (None, "")),
    ],
)
def test_asked_threads(
    monkeypatch: pytest.MonkeyPatch,
    value: int | None,
    omp: str | None,
    expected: tuple[int | None, str],
) -> None:
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert asked_threads(value, "PDPPO_JOB_THREADS") == expected


def test_own_cores_are_the_affinity_not_the_machines() -> None:
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert own_cores() == 1
    finally:
        os.sched_setaffinity(0, before)
    assert own_cores() == len(before)
