"""Test commands that leave nothing behind: a mutant's run and a baseline's test file alike.

The integration tests start the API and workers in sessions of their own, so killing pytest's
process group would orphan them. The whole tree of descendants is read from /proc before pytest
is interrupted (SIGINT lets its fixtures stop what they started), and whatever still lives after
a grace period is killed: at a timeout, at Ctrl-C, and when a budget ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from bench.mutation_contexts import descendants

GRACE_SECONDS = 30.0

_running: dict[int, subprocess.Popen[str]] = {}
STOPPING = threading.Event()
"""Set on Ctrl-C: no new mutant starts, and what runs is asked to stop (`interrupt_all`)."""


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.kill(pid, signal.SIGKILL)


def interrupt_all() -> None:
    """Stops every running test command the way a timeout does, so that no server lives on."""
    STOPPING.set()
    procs = list(_running.values())
    trees = {p.pid: set(descendants(p.pid)) for p in procs}
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + GRACE_SECONDS
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in procs:
        _kill(sorted(trees[proc.pid] | {proc.pid}))


def _stop(proc: subprocess.Popen[str]) -> str:
    """Interrupts `proc`, kills what of its tree outlives the grace; its output so far."""
    tree = set(descendants(proc.pid))
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        tree |= set(descendants(proc.pid))
        proc.kill()
        out, _ = proc.communicate()
    _kill(sorted(tree))
    return out


def run_command(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float | None
) -> tuple[int | None, str]:
    """(exit code or None on timeout, output, stderr within); on timeout nothing it started
    survives, nor on a Ctrl-C that reaches this thread (the baseline's), which is raised on."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    _running[proc.pid] = proc
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        return None, _stop(proc)
    except KeyboardInterrupt:
        _stop(proc)
        raise
    finally:
        _running.pop(proc.pid, None)
