"""Suite-wide pytest settings.

`-n auto` (README's test command, pytest-xdist) runs the suite in this many worker processes:
two per CPU, since most tests spend their time waiting on processes of their own (redis-server,
the API, Celery workers, training subprocesses), and at most one per 3 GiB of memory, each worker
starting its own Redis and service. PYTEST_XDIST_AUTO_NUM_WORKERS overrides it, `-n N` too, and
`-n 0` runs in this process."""

from __future__ import annotations

import os
import sys

import pytest

GIB_PER_WORKER = 3
WORKERS_PER_CPU = 2


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return float(GIB_PER_WORKER)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cpus = len(os.sched_getaffinity(0))
    return max(1, min(WORKERS_PER_CPU * cpus, int(_memory_gib() // GIB_PER_WORKER)))


def pytest_configure(config: pytest.Config) -> None:
    """On a pytest-xdist worker: torch's threads (and those of the processes tests start) are
    the worker's share of the CPUs, one at least. Torch takes every CPU by default, so N workers
    on this many CPUs would run N times too many threads, which spin waiting for each other."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    threads = str(max(1, len(os.sched_getaffinity(0)) // int(workers)))
    os.environ.setdefault("OMP_NUM_THREADS", threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
