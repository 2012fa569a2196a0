"""pytest plugin for `bench/mutation.py`'s baseline run: names each test's coverage and times it.

Loaded with `-p mutation_contexts` in the unmutated copy, under coverage started by coverage.py's
own `.pth` hook (`COVERAGE_PROCESS_START`), so that the API, Celery workers and job processes the
integration tests start are measured too. Lines run inside this process while a test runs are
recorded under the test's node id (a dynamic context). A child process cannot know the test, so
a thread watches this process's descendants (/proc, every 0.2 s) and notes during which tests
each pid was alive: a service a test started and stopped (`make_service`) belongs to that test,
one that outlives tests (the session's `service`) to all of them. `bench/mutation_cover.py`
charges each child's coverage file (named with its pid) accordingly, and charges import-time
lines (the empty context) to every test of the file.

Writes `{"pid", "order", "call", "total", "failed", "owners"}` to `$PDPPO_MUTATION_TIMES` at the
end of the session: the collection order, each test's call time (to run the quickest killers
first), its time with set-up and tear-down (for the timeout) and, per child pid, the tests it
was seen during ("" between tests).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_order: list[str] = []
_call: dict[str, float] = {}
_total: dict[str, float] = {}
_failed: list[str] = []
_owners: dict[int, set[str]] = {}
_current = [""]
_stop = threading.Event()
POLL_SECONDS = 0.2


def descendants(pid: int) -> list[int]:
    """Every live process under `pid`, read from /proc (children first found, then theirs)."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _watch() -> None:
    me = os.getpid()
    while not _stop.wait(POLL_SECONDS):
        test = _current[0]
        for pid in descendants(me):
            _owners.setdefault(pid, set()).add(test)


def pytest_sessionstart(session: pytest.Session) -> None:
    threading.Thread(target=_watch, name="mutation-owners", daemon=True).start()


def _coverage() -> Any:
    """The coverage the `.pth` hook started in this process, if any (None outside a baseline)."""
    try:
        import coverage
    except ImportError:
        return None
    return coverage.Coverage.current()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    cov = _coverage()
    if cov is not None:
        cov.switch_context(item.nodeid)
    _current[0] = item.nodeid
    _order.append(item.nodeid)
    start = time.monotonic()
    yield
    _total[item.nodeid] = time.monotonic() - start
    _current[0] = ""
    if cov is not None:
        cov.switch_context("")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _call[report.nodeid] = report.duration
    if report.failed and report.nodeid not in _failed:
        _failed.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _stop.set()
    target = os.environ.get("PDPPO_MUTATION_TIMES")
    if target:
        owners = {pid: sorted(tests) for pid, tests in _owners.items()}
        payload = {
            "pid": os.getpid(),
            "order": _order,
            "call": _call,
            "total": _total,
            "failed": _failed,
            "owners": owners,
        }
        Path(target).write_text(json.dumps(payload))
