"""The first few milliseconds of every `pdppo dev` child, before it becomes the real program.

Run as `python -S launch.py PARENT_PID NAME PROGRAM [ARGS...]` with stdout on the child's log
(opened for appending). It

1. asks Linux to SIGTERM it when its parent thread dies, even by SIGKILL, so a killed
   `pdppo dev` leaves no orphan (the setting survives `exec`);
2. writes the start marker into the log, `==== pdppo dev: worker started at ... (pid N) ====`,
   with its own pid, which `exec` keeps: the marker always comes before the program's first byte
   and names the pid a user (or a test) can look for;
3. `exec`s the program.

Why a separate process step instead of `Popen(preexec_fn=...)`: `pdppo dev` restarts children
from its supervisor thread while the main thread may be importing or talking HTTP, and running
Python code between `fork` and `exec` in a threaded process can deadlock (the docs of `preexec_fn`
say so). This file imports only the standard library, so `-S` (no site-packages) is enough.
"""

from __future__ import annotations

import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> bool:
    """PR_SET_PDEATHSIG; False if the parent is already gone (it died before the prctl)."""
    if sys.platform != "linux":
        return True
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except OSError:
        return True
    return os.getppid() == parent_pid


def marker(text: str) -> bytes:
    """A line that stands out in a log: what pdppo dev itself did or saw, with a UTC time."""
    return f"==== pdppo dev: {text} ====\n".encode()


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        sys.stderr.write("usage: launch.py PARENT_PID NAME PROGRAM [ARGS...]\n")
        return 2
    parent, name, command = int(argv[0]), argv[1], argv[2:]
    if not _die_with_parent(parent):
        return 1
    os.write(1, marker(f"{name} started at {utc_now()} (pid {os.getpid()})"))
    os.execvp(command[0], command)
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
