"""One process of the dev stack: how it starts, how its death is explained, how it stops.

Its log is appended to, never truncated: a start marker, the program's output, then a line saying
how it ended (signal, exit code, peak memory). The evidence of a crash survives the restart that
follows it, and the next `pdppo dev` too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pdppo.devstack import launch

STOP_TIMEOUT_S = 15.0
LEFTOVER_GRACE_S = 5.0
LOG_MAX_BYTES = 10 * 1024 * 1024  # checked at each start: a bigger log moves to <name>.log.1
TAIL_LINES = 20

# What a signal usually means when it ends a child that nobody asked to stop.
SIGNAL_HINTS: dict[int, str] = {
    signal.SIGKILL: "the kernel's OOM killer sends this when memory runs out",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGBUS: "a crash in native code, or a memory-mapped file that went away",
    signal.SIGABRT: "a native library aborted",
    signal.SIGTERM: "something outside pdppo dev asked it to stop",
    signal.SIGINT: "an interrupt that reached it directly",
    signal.SIGHUP: "its terminal went away",
}


def describe_exit(returncode: int) -> str:
    """`killed by SIGKILL (...)` or `exited with code 3`, from a Popen-style return code."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    hint = SIGNAL_HINTS.get(number)
    return f"killed by {name}" + (f" ({hint})" if hint else "")


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this cgroup, if Linux says.

    cgroup v2 has it in memory.events, v1 in memory.oom_control (both as `oom_kill N`). A rise
    while a child ran turns "killed by SIGKILL" from a likely OOM into a certain one."""
    if sys.platform != "linux":
        return None
    candidates: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":
            candidates += [Path("/sys/fs/cgroup", relative, "memory.events")]
        elif "memory" in controllers.split(","):
            candidates += [Path("/sys/fs/cgroup/memory", relative, "memory.oom_control")]
    # inside a cgroup namespace the own group is mounted as the root
    candidates += [
        Path("/sys/fs/cgroup/memory.events"),
        Path("/sys/fs/cgroup/memory/memory.oom_control"),
    ]
    for candidate in candidates:
        try:
            text = candidate.read_text()
        except OSError:
            continue
        for entry in text.splitlines():
            key, _, value = entry.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rotate_log(path: Path, max_bytes: int) -> None:
    """Moves a log past `max_bytes` to `<path>.1` (replacing an older one) before a start."""
    try:
        if max_bytes > 0 and path.stat().st_size > max_bytes:
            path.replace(path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass


def read_tail(
    path: Path, lines: int = TAIL_LINES, start: int = 0, max_bytes: int = 64 * 1024
) -> str:
    """The last lines of a log after byte `start`, read from its end (logs grow to megabytes)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(start if start <= size else 0, size - max_bytes))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


@dataclass
class Child:
    """One managed process, started in its own session, with the log file it appends to."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    stop_signal: int = signal.SIGTERM
    log_max_bytes: int = LOG_MAX_BYTES
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0  # time.monotonic() of the last start
    peak_rss_bytes: int | None = None  # of the last run, once it has been reaped
    _oom_kills_at_start: int | None = field(default=None, repr=False)
    _log_offset: int = field(default=0, repr=False)  # where the last run's lines begin
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> None:
        """Starts the program through `launch.py`; safe to call from any thread."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_log(self.log_path, self.log_max_bytes)
        argv = [sys.executable, "-S", launch.__file__, str(os.getpid()), self.name, *self.argv]
        with self._lock, self.log_path.open("ab") as log:
            self._log_offset = log.seek(0, os.SEEK_END)
            self._oom_kills_at_start = oom_kill_count()
            self.peak_rss_bytes = None
            self.started_at = time.monotonic()
            # start_new_session: a Ctrl-C in the terminal reaches only pdppo dev, and the child
            # leads a process group that stop() can signal as a whole.
            self.proc = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def poll(self) -> int | None:
        """The return code once the process has ended, else None.

        Reaps with wait4 rather than Popen.poll to learn the peak memory of the run: after an
        OOM kill that number is the only trace in pdppo dev's hands."""
        with self._lock:
            proc = self.proc
            if proc is None or proc.returncode is not None:
                return None if proc is None else proc.returncode
            try:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere; Popen knows the code
                return proc.poll()
            if pid == 0:
                return None
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.peak_rss_bytes = usage.ru_maxrss * 1024  # Linux reports KiB
            return proc.returncode

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.poll() is None

    def uptime(self) -> float:
        return time.monotonic() - self.started_at

    def death_report(self) -> str:
        """Why the last run ended: signal or code, how long it ran, its peak memory."""
        assert self.proc is not None and self.proc.returncode is not None
        parts = [f"{self.name} (pid {self.proc.pid}) {describe_exit(self.proc.returncode)}"]
        parts.append(f"after running {self.uptime():.0f}s")
        if self.peak_rss_bytes:
            parts.append(f"peak memory {format_bytes(self.peak_rss_bytes)}")
        before, after = self._oom_kills_at_start, oom_kill_count()
        if before is not None and after is not None and after > before:
            parts.append(f"the kernel's OOM killer killed {after - before} process(es) meanwhile")
        return ", ".join(parts)

    def note(self, text: str) -> None:
        """Appends a marker line to the child's log, between (or after) the program's lines."""
        with contextlib.suppress(OSError), self.log_path.open("ab") as log:
            log.write(launch.marker(text))

    def log_tail(self, lines: int = TAIL_LINES) -> str:
        """The last lines the current (or last) run wrote, not those of earlier runs."""
        return read_tail(self.log_path, lines, start=self._log_offset)

    def kill_leftovers(self, grace: float = LEFTOVER_GRACE_S) -> None:
        """After the leader died on its own: end what it left in its process group (a job's
        subprocess, a server's workers), so that a restart never runs beside an orphan."""
        if self.proc is None or not group_alive(self.proc.pid):
            return
        signal_group(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        signal_group(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Graceful signal to the whole process group, then SIGKILL for what remains."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session makes the child its group's leader
        was_running = self.poll() is None
        if was_running:
            signal_group(pgid, self.stop_signal)
            deadline = time.monotonic() + timeout
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.poll() is None:
                signal_group(pgid, signal.SIGKILL)
                while self.poll() is None:
                    time.sleep(0.05)
        # Grandchildren (Celery's pool, uvicorn's workers) may outlive the leader briefly.
        deadline = time.monotonic() + timeout
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_alive(pgid):
            signal_group(pgid, signal.SIGKILL)
        if was_running and self.proc.returncode is not None:
            self.note(
                f"{self.name} stopped by pdppo dev at {launch.utc_now()} "
                f"({describe_exit(self.proc.returncode)})"
            )
