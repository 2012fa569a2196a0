"""`pdppo dev` run as a user runs it, for the tests: in its own session, output collected."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.support.stack import pdppo_command


class DevProcess:
    """`pdppo dev` in its own session (as a shell runs it), its output collected line by line."""

    def __init__(
        self,
        args: list[str],
        cwd: Path,
        sigint_ignored: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        # A shell starts background jobs with SIGINT ignored; Ctrl-C must still work then.
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        self.proc = subprocess.Popen(
            [*pdppo_command(), "dev", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=ignore,
            env={
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "PDPPO_WORKER_TORCH_THREADS": "1",
                **(env or {}),
            },
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 180) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the reader drain the pipe
                found = re.search(pattern, self.output)
                if found:
                    return found
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in pdppo dev output:\n{self.output[-4000:]}")

    def url_and_key(self) -> tuple[str, str]:
        url = self.wait_for(r"API\s+(http://\S+)").group(1)
        key = self.wait_for(r"API key\s+(\S+)").group(1)
        return url, key

    def stop(self, sig: int) -> int:
        os.kill(self.proc.pid, sig)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc (children of children included)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has exited; only its exit status is left to collect)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def started_pids(log: Path, name: str) -> list[int]:
    """The pids of a child's start markers in its (appended) log, oldest first."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [
        int(pid)
        for pid in re.findall(rf"==== pdppo dev: {name} started at \S+ \(pid (\d+)\)", text)
    ]


def wait_for_start(log: Path, name: str, count: int, timeout: float = 60) -> int:
    """The pid of the `count`-th start of a child, once its marker is in the log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = started_pids(log, name)
        if len(pids) >= count:
            return pids[count - 1]
        time.sleep(0.05)
    raise AssertionError(
        f"{name} was not started {count} times; {log} has {started_pids(log, name)}"
    )


def processes_mentioning(text: str) -> list[int]:
    """Running processes whose command line contains `text` (such as a test's data folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and running(int(entry.name)):
            found.append(int(entry.name))
    return found


def wait_gone(pids: set[int], timeout: float = 10) -> list[int]:
    """Waits for the processes to end; returns those still running after `timeout`."""
    deadline = time.monotonic() + timeout
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(p for p in pids if running(p))
