"""A child process that must not outlive its parent: grader servers, a job's ranks, `pdppo dev`'s
services. The parent may die by SIGKILL, which runs no cleanup, and the child may be stuck where
it never looks at its parent (a hung grader, a collective that waits 30 minutes for a dead peer);
the kernel's parent-death signal reaches it anyway."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when the process that started it dies
    (Linux; elsewhere nothing is armed). False when `parent` is gone already: it died before the
    signal was armed, and the caller should exit now.

    The signal goes when the parent *thread* that forked this process exits: fork from the main
    thread of a process that lives as long as its children should."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
    return os.getppid() == parent
